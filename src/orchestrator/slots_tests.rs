//! Tests of the agent slots' board and score.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn settings(max_runs: usize, per_repo: usize) -> SlotSettings {
    SlotSettings {
        max_runs,
        max_runs_per_repository: per_repo,
        weights: ScoreWeights::default(),
    }
}

fn counter() -> (Arc<AtomicUsize>, Waker) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    (
        n,
        Arc::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
        }),
    )
}

fn bid(score: i64, minutes_ago: i64) -> Bid {
    Bid {
        action_id: Uuid::new_v4(),
        queued_at: Utc::now() - chrono::Duration::minutes(minutes_ago),
        score,
        why: vec![format!("test: {score:+}")],
    }
}

fn ids(d: &Decision) -> Vec<Uuid> {
    d.granted.iter().map(|(id, _)| *id).collect()
}

#[test]
fn the_score_says_each_part_labels_matched_without_case() {
    let w = ScoreWeights::default();
    let now = Utc::now();
    let facts = SlotFacts {
        unblocks: 2,
        labels: vec!["Critical".into(), "docs".into(), "quick-win".into()],
        retries: 1,
    };
    let (score, why) = w.score(&facts, now - chrono::Duration::minutes(12), now);
    assert_eq!(score, 200 + 300 + 50 + 24 - 50);
    assert_eq!(
        why,
        [
            "unblocks 2 queued task(s): +200",
            "label Critical: +300",
            "label quick-win: +50",
            "queued 12 min: +24",
            "retry 1: -50",
        ]
    );
    assert_eq!(
        w.score(&SlotFacts::default(), now, now),
        (0, Vec::<String>::new())
    );
}

#[test]
fn the_highest_bids_across_repositories_get_the_slots_and_the_others_are_woken() {
    let board = SlotBoard::new(settings(2, 2));
    let (a_woken, a_wake) = counter();
    let (b_woken, b_wake) = counter();
    let a = board.join("o/a", a_wake);
    let b = board.join("o/b", b_wake);
    // b offers a critical task first but holds a run; a then offers two plain ones.
    let critical = bid(300, 0);
    let d = b.decide(1, vec![critical.clone()]);
    assert_eq!(ids(&d), [critical.action_id], "{d:?}");
    let (id, meta) = &d.granted[0];
    assert_eq!(*id, critical.action_id);
    assert_eq!(meta.score, 300 - 150);
    assert_eq!(meta.slots_taken, 2);
    assert_eq!(meta.why.last().unwrap(), "1 run(s) of its repository: -150");
    assert_eq!(board.held(), 2);
    // The board is full: a's bids wait, saying why.
    let plain = [bid(0, 1), bid(0, 0)];
    let d = a.decide(0, plain.to_vec());
    assert!(d.granted.is_empty());
    assert_eq!(d.waiting.len(), 2);
    assert!(
        d.waiting[0]
            .1
            .starts_with("waiting for an agent slot: 2 of 2 taken (autopilot.daemon.maxRuns)"),
        "{}",
        d.waiting[0].1
    );
    assert_eq!(a_woken.load(Ordering::SeqCst), 0);
    // b's runs end: its next drain says so and a, whose bids get the slots, is woken.
    let d = b.decide(0, vec![]);
    assert!(d.granted.is_empty());
    assert_eq!(a_woken.load(Ordering::SeqCst), 1);
    let d = a.decide(0, plain.to_vec());
    // The older first; the second after the first's share (-150) still ranks: nothing else bids.
    assert_eq!(ids(&d), [plain[0].action_id, plain[1].action_id]);
    assert_eq!(d.granted[1].1.score, -150);
    assert_eq!(b_woken.load(Ordering::SeqCst), 0);
}

#[test]
fn a_free_slot_ranked_to_another_repository_is_left_for_it() {
    let board = SlotBoard::new(settings(1, 1));
    let (_, a_wake) = counter();
    let (b_woken, b_wake) = counter();
    let a = board.join("o/a", a_wake);
    let b = board.join("o/b", b_wake);
    let full = bid(0, 0);
    // b holds the slot; a and b both bid.
    assert!(b.decide(1, vec![]).granted.is_empty());
    let critical = bid(300, 0);
    assert!(a.decide(0, vec![full.clone()]).granted.is_empty());
    // b's run ends and it bids a critical task: it is ranked first, so it gets the slot.
    let d = b.decide(0, vec![critical.clone()]);
    assert_eq!(ids(&d), [critical.action_id]);
    // a, waking, finds it taken (and says that b's runs hold it).
    let d = a.decide(0, vec![full.clone()]);
    assert!(d.granted.is_empty());
    // Now b's run ends and b's next bid is plain and newer than a's: a's older one ranks
    // first, so b leaves the slot for a and wakes it.
    let newer = bid(0, 0);
    let woken = b_woken.load(Ordering::SeqCst);
    let d = b.decide(0, vec![newer]);
    assert!(d.granted.is_empty(), "{d:?}");
    assert!(d.waiting[0]
        .1
        .contains("left to higher scores of other repositories"));
    let d = a.decide(0, vec![full.clone()]);
    assert_eq!(ids(&d), [full.action_id]);
    assert_eq!(b_woken.load(Ordering::SeqCst), woken);
}

#[test]
fn a_repository_at_its_cap_waits_while_another_takes_the_free_slots() {
    let board = SlotBoard::new(SlotSettings {
        max_runs: 4,
        max_runs_per_repository: 2,
        weights: ScoreWeights {
            per_run_of_repository: 0,
            ..ScoreWeights::default()
        },
    });
    let (_, wake) = counter();
    let a = board.join("o/a", wake.clone());
    let b = board.join("o/b", wake);
    let a_bids: Vec<Bid> = (0..3).map(|_| bid(0, 5)).collect();
    let d = a.decide(0, a_bids.clone());
    // Two of four: a's cap, and the rest of a's wait for it.
    assert_eq!(d.granted.len(), 2);
    assert!(d.waiting[0].1.starts_with(
        "waiting for an agent slot: o/a runs 2 of its 2 (autopilot.daemon.maxRunsPerRepository)"
    ));
    // b's bids take the two slots a cannot.
    let b_bids: Vec<Bid> = (0..2).map(|_| bid(0, 5)).collect();
    let d = b.decide(0, b_bids);
    assert_eq!(d.granted.len(), 2);
    assert_eq!(board.held(), 4);
}

#[test]
fn a_left_seat_frees_its_slots_and_wakes_those_waiting() {
    let board = SlotBoard::new(settings(1, 1));
    let (a_woken, a_wake) = counter();
    let (_, b_wake) = counter();
    let a = board.join("o/a", a_wake);
    let b = board.join("o/b", b_wake);
    assert_eq!(b.decide(0, vec![bid(0, 0)]).granted.len(), 1);
    let waiting = bid(0, 0);
    assert!(a.decide(0, vec![waiting.clone()]).granted.is_empty());
    drop(b);
    assert_eq!(a_woken.load(Ordering::SeqCst), 1);
    assert_eq!(
        ids(&a.decide(0, vec![waiting.clone()])),
        [waiting.action_id]
    );
    // A restarted repository's new seat is not removed by the old one's drop.
    let (_, wake) = counter();
    let old = board.join("o/c", wake.clone());
    let new = board.join("o/c", wake);
    drop(old);
    assert!(new.decide(0, vec![]).granted.is_empty());
    assert_eq!(board.lock().seats.len(), 2);
}

#[test]
fn a_paused_board_starts_nothing_in_any_repository_and_wakes_them_when_lifted() {
    let board = SlotBoard::new(settings(4, 4));
    let (a_woken, a_wake) = counter();
    let (_, b_wake) = counter();
    let a = board.join("o/a", a_wake);
    let b = board.join("o/b", b_wake);
    board.pause(Some("the daemon's daily budget is spent".into()));
    let waiting = bid(500, 10);
    for seat in [&a, &b] {
        let d = seat.decide(0, vec![waiting.clone()]);
        assert!(d.granted.is_empty());
        assert!(
            d.waiting[0]
                .1
                .contains("paused in every repository: the daemon's daily budget"),
            "{:?}",
            d.waiting
        );
    }
    board.pause(None);
    assert_eq!(a_woken.load(Ordering::SeqCst), 1);
    assert_eq!(
        ids(&a.decide(0, vec![waiting.clone()])),
        [waiting.action_id]
    );
}

#[test]
fn right_after_a_start_no_slot_is_given_until_every_expected_repository_has_offered() {
    let board = SlotBoard::new(settings(2, 2));
    board.expect(vec!["o/a".into(), "O/B".into()], Duration::from_secs(600));
    let (a_woken, a_wake) = counter();
    let (_, b_wake) = counter();
    let a = board.join("o/a", a_wake);
    // a is up first with two tasks: both wait for b, saying why.
    let mine = [bid(0, 1), bid(0, 0)];
    let d = a.decide(0, mine.to_vec());
    assert!(d.granted.is_empty(), "{d:?}");
    assert_eq!(d.waiting.len(), 2);
    assert!(
        d.waiting[0]
            .1
            .contains("1 repositories of the daemon have not offered"),
        "{}",
        d.waiting[0].1
    );
    // b comes up (its name in another case) with a critical task: it ranks first, and a is
    // woken to take the other slot.
    let b = board.join("o/b", b_wake);
    let critical = bid(300, 0);
    let d = b.decide(0, vec![critical.clone()]);
    assert_eq!(ids(&d), [critical.action_id]);
    assert_eq!(a_woken.load(Ordering::SeqCst), 1);
    let d = a.decide(0, mine.to_vec());
    assert_eq!(ids(&d), [mine[0].action_id]);
}

#[test]
fn a_repository_that_does_not_come_is_waited_for_until_it_fails_or_the_grace_ends() {
    let board = SlotBoard::new(settings(2, 2));
    board.expect(
        vec!["o/a".into(), "o/broken".into()],
        Duration::from_secs(600),
    );
    let (a_woken, a_wake) = counter();
    let a = board.join("o/a", a_wake);
    let first = bid(0, 0);
    assert!(a.decide(0, vec![first.clone()]).granted.is_empty());
    // Its start failed: the board waits no more, and a is woken.
    board.not_coming("o/broken");
    assert_eq!(a_woken.load(Ordering::SeqCst), 1);
    assert_eq!(ids(&a.decide(0, vec![first.clone()])), [first.action_id]);

    // A repository that never says anything is waited for only as long as the grace.
    let board = SlotBoard::new(settings(2, 2));
    board.expect(
        vec!["o/a".into(), "o/silent".into()],
        Duration::from_millis(50),
    );
    let (_, a_wake) = counter();
    let a = board.join("o/a", a_wake);
    assert!(a.decide(0, vec![first.clone()]).granted.is_empty());
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(ids(&a.decide(0, vec![first.clone()])), [first.action_id]);
    // A repository that had offered before the board was told to expect it is not awaited.
    let board = SlotBoard::new(settings(2, 2));
    let (_, a_wake) = counter();
    let a = board.join("o/a", a_wake);
    assert!(a.decide(0, vec![]).granted.is_empty());
    board.expect(vec!["o/a".into()], Duration::from_secs(600));
    assert_eq!(ids(&a.decide(0, vec![first.clone()])), [first.action_id]);
}
