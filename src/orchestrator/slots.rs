//! The daemon's agent slots: one board ([`SlotBoard`]) for every repository a daemon serves.
//! A run of a step that takes a slot ([`super::Step::takes_agent_slot`]: the agent runs in
//! sandboxes) starts only with one of `maxRuns` slots, at most `maxRunsPerRepository` of them
//! for one repository; its detached run keeps it until collected. Host-side steps (coordinate,
//! plan, resolve, notify, ...) take none.
//!
//! Each repository's drain offers its ready candidates as bids, with the runs it holds
//! ([`SlotSeat::decide`]). The board ranks every repository's bids by score, greedily: the
//! highest first, a repository's score lowered for each run it holds or was just given, ties
//! to the repository given a slot least recently (round-robin), then the oldest. A free slot
//! ranked to another repository is left for it (it is woken to take it). What a run got its
//! slot by is recorded on its span (`meta.scheduled`); a bid that waits says why.
//!
//! Right after a start, the board gives out no slot until every repository it was told to
//! expect ([`SlotBoard::expect`]) has offered its work once, or a grace has passed: the
//! repositories that come up first do not take every slot before the others have bid.
//!
//! The score (docs/configuration.md, "The scheduler's score"): `+perUnblockedTask` for each
//! queued task that waits on it, the weight of each of its labels, `+perMinuteWaited` for each
//! minute it has been queued (so nothing starves), `-perRetry` for each earlier failed run of
//! the task, `-perRunOfRepository` for each run its repository holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::store::ScheduledMeta;

/// A repository whose drain has not offered its bids for this long is left out of the
/// ranking: a stuck or gone repository never holds a free slot for itself.
const STALE_BIDS: Duration = Duration::from_secs(120);

/// The weights of the score.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreWeights {
    pub per_unblocked_task: i64,
    /// Label name (matched without regard to case) → weight.
    pub labels: BTreeMap<String, i64>,
    pub per_minute_waited: i64,
    pub per_retry: i64,
    pub per_run_of_repository: i64,
}

impl Default for ScoreWeights {
    fn default() -> ScoreWeights {
        ScoreWeights {
            per_unblocked_task: 100,
            labels: BTreeMap::from([("critical".to_owned(), 300), ("quick-win".to_owned(), 50)]),
            per_minute_waited: 2,
            per_retry: 50,
            per_run_of_repository: 150,
        }
    }
}

/// The board's limits and weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSettings {
    /// Agent runs at once across every repository.
    pub max_runs: usize,
    /// Agent runs at once for one repository.
    pub max_runs_per_repository: usize,
    pub weights: ScoreWeights,
}

impl SlotSettings {
    /// What this machine holds: a run per core and per 2 GiB of memory, at least 2.
    pub fn machine_max_runs() -> usize {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let by_memory = memory_bytes().map_or(cores, |m| {
            usize::try_from(m / (2 << 30)).unwrap_or(usize::MAX)
        });
        cores.min(by_memory).max(2)
    }
}

impl Default for SlotSettings {
    fn default() -> SlotSettings {
        let max_runs = SlotSettings::machine_max_runs();
        SlotSettings {
            max_runs,
            max_runs_per_repository: max_runs,
            weights: ScoreWeights::default(),
        }
    }
}

/// The machine's memory (`/proc/meminfo`'s `MemTotal`), when it can be read.
fn memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What a slot-taking step says of a queued action, for its score.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotFacts {
    /// Queued tasks that wait on this one, directly or through others.
    pub unblocks: usize,
    /// Its issue's or pull request's labels.
    pub labels: Vec<String>,
    /// Earlier runs of the same task that failed (the resolver's iterations, retries).
    pub retries: u32,
}

impl ScoreWeights {
    /// The score of an action with `facts`, queued at `queued_at`, before its repository's
    /// share: the total and each part said.
    pub fn score(
        &self,
        facts: &SlotFacts,
        queued_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (i64, Vec<String>) {
        let mut parts = Vec::new();
        if facts.unblocks > 0 {
            let n = i64::try_from(facts.unblocks).unwrap_or(i64::MAX);
            parts.push((
                format!("unblocks {n} queued task(s)"),
                n.saturating_mul(self.per_unblocked_task),
            ));
        }
        for label in &facts.labels {
            let weight = self
                .labels
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(label))
                .map(|(_, w)| *w);
            if let Some(weight) = weight.filter(|w| *w != 0) {
                parts.push((format!("label {label}"), weight));
            }
        }
        let minutes = (now - queued_at).num_minutes().max(0);
        if minutes > 0 {
            parts.push((
                format!("queued {minutes} min"),
                minutes.saturating_mul(self.per_minute_waited),
            ));
        }
        if facts.retries > 0 {
            parts.push((
                format!("retry {}", facts.retries),
                -i64::from(facts.retries).saturating_mul(self.per_retry),
            ));
        }
        let total = parts.iter().fold(0i64, |t, (_, v)| t.saturating_add(*v));
        (total, parts.into_iter().map(|(w, v)| said(&w, v)).collect())
    }

    /// The share part: what `runs` held by the repository take off.
    fn share(&self, runs: usize) -> i64 {
        -i64::try_from(runs)
            .unwrap_or(i64::MAX)
            .saturating_mul(self.per_run_of_repository)
    }
}

fn said(what: &str, value: i64) -> String {
    format!("{what}: {value:+}")
}

/// A candidate a repository offers.
#[derive(Debug, Clone)]
pub struct Bid {
    pub action_id: Uuid,
    pub queued_at: DateTime<Utc>,
    /// The score before the repository's share, and its parts.
    pub score: i64,
    pub why: Vec<String>,
}

/// What the board decided of one repository's bids.
#[derive(Debug, Default)]
pub struct Decision {
    /// Bids that start now, with what to record on their spans.
    pub granted: Vec<(Uuid, ScheduledMeta)>,
    /// Bids that wait, and why.
    pub waiting: Vec<(Uuid, String)>,
}

/// A repository's drain, woken when a slot is left for it.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

struct Seat {
    id: u64,
    held: usize,
    bids: Vec<Bid>,
    offered: Instant,
    /// When it was last given a slot (the board's count of grants), for the round-robin.
    last_grant: u64,
    wake: Waker,
    /// Whether it has offered its work once.
    offered_once: bool,
}

#[derive(Default)]
struct BoardState {
    seats: BTreeMap<String, Seat>,
    grants: u64,
    seat_ids: u64,
    /// The repositories expected at the start that have not offered their work yet, and until
    /// when the board waits for them.
    expected: Vec<String>,
    expect_until: Option<Instant>,
}

impl BoardState {
    /// How many expected repositories are still awaited (none once the grace has passed).
    fn awaited(&self) -> usize {
        match self.expect_until {
            Some(until) if Instant::now() < until => self.expected.len(),
            _ => 0,
        }
    }

    /// `repo` offered its work, or will never (it failed to start): the wakers of those
    /// waiting when it was the last one awaited.
    fn arrived(&mut self, repo: &str) -> Vec<Waker> {
        let before = self.expected.len();
        self.expected.retain(|r| !r.eq_ignore_ascii_case(repo));
        if before > 0 && self.expected.is_empty() {
            self.seats.values().map(|s| s.wake.clone()).collect()
        } else {
            Vec::new()
        }
    }
}

/// See the module documentation.
pub struct SlotBoard {
    settings: SlotSettings,
    state: Mutex<BoardState>,
    /// Why no agent run starts in any repository (the daemon's budget or circuit breaker).
    paused: Mutex<Option<String>>,
}

/// One ranked pick: the repository and its bid's index, its score with the share.
struct Pick {
    repo: String,
    index: usize,
    score: i64,
    share: i64,
    runs_before: usize,
}

impl SlotBoard {
    pub fn new(settings: SlotSettings) -> Arc<SlotBoard> {
        Arc::new(SlotBoard {
            settings,
            state: Mutex::new(BoardState::default()),
            paused: Mutex::new(None),
        })
    }

    /// Hold every repository's new agent runs, saying `why` (`None`: let them start again;
    /// the repositories with bids are woken).
    pub fn pause(&self, why: Option<String>) {
        let lifted = {
            let mut paused = self
                .paused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let lifted = paused.is_some() && why.is_none();
            *paused = why;
            lifted
        };
        if lifted {
            let woken: Vec<Waker> = self
                .lock()
                .seats
                .values()
                .filter(|s| !s.bids.is_empty())
                .map(|s| s.wake.clone())
                .collect();
            for wake in woken {
                wake();
            }
        }
    }

    /// Why new agent runs are held, if they are.
    pub fn paused(&self) -> Option<String> {
        self.paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn settings(&self) -> &SlotSettings {
        &self.settings
    }

    /// The board waits, at most `grace`, for each of `repos` to offer its work once before it
    /// gives out a slot (a daemon file's repositories at the start).
    pub fn expect(&self, mut repos: Vec<String>, grace: Duration) {
        let mut state = self.lock();
        repos.retain(|r| {
            !state
                .seats
                .iter()
                .any(|(k, s)| k.eq_ignore_ascii_case(r) && s.offered_once)
        });
        state.expected = repos;
        state.expect_until = Some(Instant::now() + grace);
    }

    /// `repo` will not offer its work (it could not be started): the board stops waiting for
    /// it.
    pub fn not_coming(&self, repo: &str) {
        let woken = self.lock().arrived(repo);
        for wake in woken {
            wake();
        }
    }

    /// Every seat looks again (the start's grace has passed).
    pub fn wake_all(&self) {
        let woken: Vec<Waker> = self.lock().seats.values().map(|s| s.wake.clone()).collect();
        for wake in woken {
            wake();
        }
    }

    fn lock(&self) -> MutexGuard<'_, BoardState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `repo` takes a seat (replacing one it had: a restarted repository); the seat is left
    /// when the returned guard is dropped.
    pub fn join(self: &Arc<SlotBoard>, repo: &str, wake: Waker) -> SlotSeat {
        let mut state = self.lock();
        state.seat_ids += 1;
        let id = state.seat_ids;
        state.seats.insert(
            repo.to_owned(),
            Seat {
                id,
                held: 0,
                bids: Vec::new(),
                offered: Instant::now(),
                last_grant: 0,
                wake,
                offered_once: false,
            },
        );
        SlotSeat {
            board: self.clone(),
            repo: repo.to_owned(),
            id,
        }
    }

    /// Agent runs held across the daemon.
    pub fn held(&self) -> usize {
        self.lock().seats.values().map(|s| s.held).sum()
    }

    /// Ranks the fresh bids of every seat for the free slots.
    fn rank(&self, state: &BoardState, free: usize) -> Vec<Pick> {
        let mut runs: HashMap<&str, usize> = state
            .seats
            .iter()
            .map(|(r, s)| (r.as_str(), s.held))
            .collect();
        let mut taken: Vec<(&str, usize)> = Vec::new();
        let mut picks = Vec::new();
        while picks.len() < free {
            let mut best: Option<Ranked<'_>> = None;
            for (repo, seat) in &state.seats {
                let held = runs[repo.as_str()];
                if held >= self.settings.max_runs_per_repository
                    || seat.offered.elapsed() >= STALE_BIDS
                {
                    continue;
                }
                let share = self.settings.weights.share(held);
                for (index, bid) in seat.bids.iter().enumerate() {
                    if taken.contains(&(repo.as_str(), index)) {
                        continue;
                    }
                    let ranked = Ranked {
                        score: bid.score.saturating_add(share),
                        last_grant: seat.last_grant,
                        bid,
                        repo,
                        index,
                    };
                    if best.as_ref().is_none_or(|b| ranked.before(b)) {
                        best = Some(ranked);
                    }
                }
            }
            let Some(best) = best else {
                break;
            };
            let held = runs[best.repo];
            picks.push(Pick {
                repo: best.repo.to_owned(),
                index: best.index,
                score: best.score,
                share: self.settings.weights.share(held),
                runs_before: held,
            });
            taken.push((best.repo, best.index));
            *runs.get_mut(best.repo).expect("a seat") += 1;
        }
        picks
    }
}

/// A bid as ranked: with its repository's share and when that repository was last given a slot.
struct Ranked<'a> {
    score: i64,
    last_grant: u64,
    bid: &'a Bid,
    repo: &'a str,
    index: usize,
}

impl Ranked<'_> {
    /// Whether it ranks before `other`: the higher score, then the repository given a slot
    /// least recently, then the oldest, then the id (a total order: the same bids, the same
    /// picks).
    fn before(&self, other: &Ranked<'_>) -> bool {
        use std::cmp::Reverse;
        let key = |r: &Ranked<'_>| {
            (
                r.score,
                Reverse(r.last_grant),
                Reverse(r.bid.queued_at),
                r.bid.action_id,
            )
        };
        key(self) > key(other)
    }
}

/// A repository's seat at the board; leaves it when dropped.
pub struct SlotSeat {
    board: Arc<SlotBoard>,
    repo: String,
    id: u64,
}

impl SlotSeat {
    pub fn settings(&self) -> &SlotSettings {
        &self.board.settings
    }

    /// This repository holds `held` agent runs and offers `bids`: which start now, which wait
    /// and why. Other repositories a free slot is left for are woken.
    pub fn decide(&self, held: usize, bids: Vec<Bid>) -> Decision {
        let paused = self.board.paused();
        let mut wake = Vec::new();
        let decision = {
            let mut state = self.board.lock();
            let Some(seat) = state.seats.get_mut(&self.repo).filter(|s| s.id == self.id) else {
                return Decision::default();
            };
            seat.held = held;
            seat.bids = bids;
            seat.offered = Instant::now();
            seat.offered_once = true;
            let own = seat.wake.clone();
            wake.extend(
                state
                    .arrived(&self.repo)
                    .into_iter()
                    .filter(|w| !Arc::ptr_eq(w, &own)),
            );
            let awaited = state.awaited();
            let why = match paused {
                Some(why) => Some(format!("new agent runs are paused in every repository: {why}")),
                None if awaited > 0 => Some(format!("waiting for an agent slot: {awaited} repositories of the daemon have not offered their work since the start (the board waits for them a few seconds)")),
                None => None,
            };
            if let Some(why) = why {
                let seat = state.seats.get(&self.repo).expect("its seat");
                let waiting = seat
                    .bids
                    .iter()
                    .map(|b| (b.action_id, why.clone()))
                    .collect();
                // Those this offer woke (it was the last one awaited) look again all the same.
                drop(state);
                for wake in wake {
                    wake();
                }
                return Decision {
                    granted: Vec::new(),
                    waiting,
                };
            }
            let settings = &self.board.settings;
            let taken: usize = state.seats.values().map(|s| s.held).sum();
            let free = settings.max_runs.saturating_sub(taken);
            let picks = self.board.rank(&state, free);
            let waiting_total: usize = state.seats.values().map(|s| s.bids.len()).sum();
            let mut decision = Decision::default();
            let mut mine = Vec::new();
            let mut woken: Vec<&str> = Vec::new();
            for (n, pick) in picks.iter().enumerate() {
                if pick.repo == self.repo {
                    mine.push((n, pick));
                } else if !woken.contains(&pick.repo.as_str()) {
                    woken.push(pick.repo.as_str());
                    if let Some(seat) = state.seats.get(&pick.repo) {
                        wake.push(seat.wake.clone());
                    }
                }
            }
            let seat = state.seats.get(&self.repo).expect("its seat");
            for (n, pick) in &mine {
                let bid = &seat.bids[pick.index];
                let mut why = bid.why.clone();
                if pick.runs_before > 0 {
                    why.push(said(
                        &format!("{} run(s) of its repository", pick.runs_before),
                        pick.share,
                    ));
                }
                decision.granted.push((
                    bid.action_id,
                    ScheduledMeta {
                        score: pick.score,
                        why,
                        repository: self.repo.clone(),
                        slots_taken: taken + n + 1,
                        max_runs: settings.max_runs,
                        passed_over: waiting_total.saturating_sub(picks.len()),
                    },
                ));
            }
            let granted: Vec<usize> = mine.iter().map(|(_, p)| p.index).collect();
            let held_now = held + granted.len();
            for (index, bid) in seat.bids.iter().enumerate() {
                if !granted.contains(&index) {
                    decision.waiting.push((
                        bid.action_id,
                        self.why_waiting(bid, held_now, taken, &picks),
                    ));
                }
            }
            let grants = state.grants + 1;
            let seat = state.seats.get_mut(&self.repo).expect("its seat");
            seat.held = held_now;
            let mut index = 0;
            seat.bids.retain(|_| {
                index += 1;
                !granted.contains(&(index - 1))
            });
            if !granted.is_empty() {
                seat.last_grant = grants;
                state.grants = grants;
            }
            decision
        };
        let mut once: Vec<Waker> = Vec::with_capacity(wake.len());
        for w in wake {
            if !once.iter().any(|o| Arc::ptr_eq(o, &w)) {
                once.push(w);
            }
        }
        for wake in once {
            wake();
        }
        decision
    }

    fn why_waiting(&self, bid: &Bid, held: usize, taken: usize, picks: &[Pick]) -> String {
        let settings = &self.board.settings;
        if held >= settings.max_runs_per_repository {
            return format!(
                "waiting for an agent slot: {} runs {held} of its {} (autopilot.daemon.maxRunsPerRepository); score {}",
                self.repo, settings.max_runs_per_repository, bid.score
            );
        }
        let taken = (taken + picks.len()).min(settings.max_runs);
        let others = picks.iter().filter(|p| p.repo != self.repo).count();
        let left = if others > 0 {
            format!(", {others} free one(s) left to higher scores of other repositories")
        } else {
            String::new()
        };
        format!(
            "waiting for an agent slot: {taken} of {} taken (autopilot.daemon.maxRuns){left}; score {}",
            settings.max_runs, bid.score
        )
    }
}

impl Drop for SlotSeat {
    fn drop(&mut self) {
        let woken: Vec<Waker> = {
            let mut state = self.board.lock();
            if state.seats.get(&self.repo).is_some_and(|s| s.id == self.id) {
                state.seats.remove(&self.repo);
            }
            // Its slots are free: those waiting look again.
            state
                .seats
                .values()
                .filter(|s| !s.bids.is_empty())
                .map(|s| s.wake.clone())
                .collect()
        };
        for wake in woken {
            wake();
        }
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
