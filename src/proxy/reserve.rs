//! Spend that cannot race. Before a model request is forwarded, the proxy reserves its worst
//! case against every stop limit of its grant (the trace's USD and tokens, the day's and the
//! month's USD) under one lock: the spend recorded before the run, what the live runs' ledgers
//! hold and what requests in flight reserved. A limit with nothing left refuses the request;
//! otherwise it reserves its worst case or what is left of the tightest limit, whichever is
//! smaller, and what is left of a limit goes to one request at a time (a second request that
//! would get less than its worst case while another holds such a remainder is refused). When
//! the answer ends, its real usage is written to the run's ledger and only then is the
//! reservation released (when it fails, at once); an admission reads the reservations before
//! the ledgers, so a request that settles meanwhile is counted twice, never nowhere. So N
//! requests at once never pass a limit by more than one request's cost beyond the remainder it
//! took: every other request held its whole worst case.
//!
//! The worst case of a request: its `max_tokens` (Anthropic) or `max_output_tokens` (OpenAI) at
//! the model's output price, [`DEFAULT_MAX_OUTPUT_TOKENS`] when it names none, plus one token a
//! byte of its body at the input price (a token is at least a byte of text), at the 1-hour
//! cache-write price for Anthropic, the dearest way input is billed.
//!
//! Reservations live in the proxy's memory: the one proxy server of a store sees every request
//! of its runs, and a reservation dies with the request it stands for. A server shared by the
//! repositories of a daemon file keeps each reservation with its run's store: a store's day
//! and month limits count its own requests in flight and its own runs' ledgers, never another
//! repository's (the daemon's limits across them are [`super::daemon_wide`]'s).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::Utc;
use uuid::Uuid;

use super::config::ProxyPrices;
use super::grant::{Grant, GrantBudget, Provider};
use super::ledger::Stopped;
use super::server::{off_runtime, Shared};
use super::spend::{live_spend, LiveSpend};
use super::ProxyError;
use crate::agents::{usd, CLAUDE_CACHE_WRITE_1H_FACTOR};

/// The output tokens reserved for a request that names no maximum: above what any current
/// model answers in one response.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 128_000;

/// A request's worst case.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Worst {
    pub usd: f64,
    pub tokens: u64,
}

/// The worst case of a `provider` request for `model` with this JSON `body`.
#[allow(
    clippy::cast_precision_loss,
    reason = "token counts stay far below 2^52"
)]
pub fn worst_case(
    prices: &ProxyPrices,
    provider: Provider,
    model: Option<&str>,
    body: &[u8],
) -> Worst {
    #[derive(serde::Deserialize)]
    struct Limits {
        max_tokens: Option<u64>,
        max_output_tokens: Option<u64>,
    }
    let named = serde_json::from_slice::<Limits>(body).ok();
    let output = match provider {
        Provider::Anthropic => named.and_then(|l| l.max_tokens),
        Provider::Openai => named.and_then(|l| l.max_output_tokens),
    }
    .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
    let input = body.len() as u64;
    let usd = match provider {
        Provider::Anthropic => {
            let price = prices.anthropic.price(model);
            input as f64 * price.input_per_m_tok * CLAUDE_CACHE_WRITE_1H_FACTOR / 1e6
                + output as f64 * price.output_per_m_tok / 1e6
        }
        Provider::Openai => {
            let price = prices.openai.price(model);
            input as f64 * price.input_per_m_tok / 1e6
                + output as f64 * price.output_per_m_tok / 1e6
        }
    };
    Worst {
        usd,
        tokens: input.saturating_add(output),
    }
}

/// What requests in flight hold, by id.
#[derive(Default)]
pub(crate) struct Reservations {
    table: Mutex<Table>,
    /// Held while a request's spend is counted and its reservation made.
    admission: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Table {
    next: u64,
    held: HashMap<u64, Held>,
}

#[derive(Debug, Clone)]
struct Held {
    /// The proxy dir of the request's run's store.
    store: PathBuf,
    trace: Uuid,
    usd: f64,
    tokens: u64,
    /// Less than its worst case: what was left of a limit.
    partial: bool,
}

/// What requests in flight reserved, for one trace and in all of one store.
#[derive(Debug, Clone, Copy, Default)]
struct InFlight {
    trace_usd: f64,
    trace_tokens: u64,
    all_usd: f64,
    trace_requests: usize,
    /// Requests in flight that hold less than their worst case (of the trace, of all).
    trace_partial: usize,
    all_partial: usize,
}

impl Reservations {
    fn in_flight(&self, store: &Path, trace: Uuid) -> InFlight {
        let table = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut sum = InFlight::default();
        for held in table.held.values().filter(|held| held.store == store) {
            sum.all_usd += held.usd;
            sum.all_partial += usize::from(held.partial);
            if held.trace == trace {
                sum.trace_usd += held.usd;
                sum.trace_tokens += held.tokens;
                sum.trace_requests += 1;
                sum.trace_partial += usize::from(held.partial);
            }
        }
        sum
    }

    fn hold(self: &Arc<Self>, held: Held) -> Reservation {
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        table.next += 1;
        let id = table.next;
        let (usd, tokens) = (held.usd, held.tokens);
        table.held.insert(id, held);
        Reservation {
            table: self.clone(),
            id,
            usd,
            tokens,
        }
    }
}

/// One request's reservation; released when dropped.
pub(crate) struct Reservation {
    table: Arc<Reservations>,
    id: u64,
    pub usd: f64,
    pub tokens: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut table = self
            .table
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        table.held.remove(&self.id);
    }
}

/// A request no limit has room for.
#[derive(Debug, Clone)]
pub(crate) struct OverLimit {
    pub reason: String,
    pub stopped: Stopped,
}

/// Why a request could not be admitted.
#[derive(Debug)]
pub(crate) enum Refused {
    Over(OverLimit),
    /// The spend could not be read: refused rather than overspent.
    Unreadable(ProxyError),
}

/// Reserve `worst` for a request of `grant` (`None`: the grant has no limit at the wire).
pub(crate) async fn admit(
    shared: &Arc<Shared>,
    grant: &Grant,
    worst: Worst,
) -> Result<Option<Reservation>, Refused> {
    let Some(budget) = grant.budget.clone().filter(|b| !b.is_empty()) else {
        return Ok(None);
    };
    let reservations = shared.reservations.clone();
    let _admission = reservations.admission.lock().await;
    // The reservations before the ledgers: a request releases its reservation only after its
    // ledger holds its answer, so one that settles between the two reads is counted twice
    // rather than nowhere.
    let in_flight = reservations.in_flight(shared.dir(), grant.trace_id);
    let live = {
        let dir = shared.dir().to_owned();
        let grant = grant.clone();
        let periods = budget.day.is_some() || budget.month.is_some();
        off_runtime(move || live_spend(&dir, &grant, periods))
            .await
            .map_err(Refused::Unreadable)?
    };
    let room = room(&budget, &live, &in_flight).map_err(Refused::Over)?;
    let partial = worst.usd > room.usd || worst.tokens > room.tokens;
    // What is left of a limit goes to one request at a time: each such request may cost more
    // than it reserved, and the overruns of two would add up.
    let held_elsewhere = in_flight.trace_partial > 0 || (room.period && in_flight.all_partial > 0);
    if partial && held_elsewhere {
        let binding = room.binding.clone().unwrap_or(Stopped {
            at: Utc::now(),
            limit: None,
            spend_usd: 0.0,
            stop_usd: 0.0,
            spend_tokens: None,
            stop_tokens: None,
        });
        return Err(Refused::Over(OverLimit {
            reason: format!(
                "rover: what is left of the budget stop limit ({}) is held by a request in flight; the request was not sent",
                binding.describe()
            ),
            stopped: binding,
        }));
    }
    Ok(Some(reservations.hold(Held {
        store: shared.dir().to_owned(),
        trace: grant.trace_id,
        usd: worst.usd.min(room.usd).max(0.0),
        tokens: worst.tokens.min(room.tokens),
        partial,
    })))
}

/// What is left under the tightest USD limit and the token limit (`f64::INFINITY` and
/// `u64::MAX` when there is none), or the limit that has nothing left.
#[derive(Debug, Clone)]
struct Room {
    usd: f64,
    tokens: u64,
    /// The limit that leaves the least, as a stop would record it.
    binding: Option<Stopped>,
    /// Whether the tightest USD limit is a period's (every trace's requests count).
    period: bool,
}

fn room(budget: &GrantBudget, live: &LiveSpend, in_flight: &InFlight) -> Result<Room, OverLimit> {
    let now = Utc::now();
    let mut room = Room {
        usd: f64::INFINITY,
        tokens: u64::MAX,
        binding: None,
        period: false,
    };
    let pending = if in_flight.trace_requests > 0 {
        format!(
            "; {} of it reserved by {} request(s) in flight",
            usd(in_flight.trace_usd),
            in_flight.trace_requests
        )
    } else {
        String::new()
    };
    // (key, spent, stop, whose, what requests in flight hold of it)
    let mut usd_limits: Vec<(&str, f64, f64, String, String)> = Vec::new();
    if let Some(stop) = budget.stop_usd {
        let spent = budget.baseline_usd + live.trace_usd + in_flight.trace_usd;
        usd_limits.push((
            "autopilot.budget.trace.usd",
            spent,
            stop,
            "this run's trace".to_owned(),
            pending.clone(),
        ));
    }
    for (period, key, current) in [
        (
            &budget.day,
            "autopilot.budget.day.usd",
            now.format("%Y-%m-%d").to_string(),
        ),
        (
            &budget.month,
            "autopilot.budget.month.usd",
            now.format("%Y-%m").to_string(),
        ),
    ] {
        if let Some(period) = period {
            let baseline = if period.period == current {
                period.baseline_usd
            } else {
                0.0
            };
            let spent = baseline + live.all_usd + in_flight.all_usd;
            let held = if in_flight.all_usd > 0.0 {
                format!(
                    "; {} of it reserved by requests in flight",
                    usd(in_flight.all_usd)
                )
            } else {
                String::new()
            };
            usd_limits.push((
                key,
                spent,
                period.stop_usd,
                format!("the period {current}"),
                held,
            ));
        }
    }
    for (key, spent, stop, whose, held) in usd_limits {
        // Less than a millionth of a cent left is nothing left (sums of floats).
        if spent >= stop - 1e-9 {
            return Err(OverLimit {
                reason: format!(
                    "rover: {whose} reached its budget stop limit ({} of {}, {key}{held}); the request was not sent",
                    usd(spent),
                    usd(stop)
                ),
                stopped: Stopped {
                    at: now,
                    limit: Some(key.to_owned()),
                    spend_usd: spent,
                    stop_usd: stop,
                    spend_tokens: None,
                    stop_tokens: None,
                },
            });
        }
        if stop - spent < room.usd {
            room.usd = stop - spent;
            room.period = key != "autopilot.budget.trace.usd";
            room.binding = Some(Stopped {
                at: now,
                limit: Some(key.to_owned()),
                spend_usd: spent,
                stop_usd: stop,
                spend_tokens: None,
                stop_tokens: None,
            });
        }
    }
    if let Some(stop) = budget.stop_tokens {
        let spent = budget.baseline_tokens + live.trace_tokens + in_flight.trace_tokens;
        if spent >= stop {
            let key = "autopilot.budget.trace.tokens";
            return Err(OverLimit {
                reason: format!(
                    "rover: this run's trace reached its budget stop limit ({spent} of {stop} tokens, {key}{}); the request was not sent",
                    if in_flight.trace_requests > 0 {
                        format!(
                            "; {} of them reserved by {} request(s) in flight",
                            in_flight.trace_tokens, in_flight.trace_requests
                        )
                    } else {
                        String::new()
                    }
                ),
                stopped: Stopped {
                    at: now,
                    limit: Some(key.to_owned()),
                    spend_usd: budget.baseline_usd + live.trace_usd,
                    stop_usd: 0.0,
                    spend_tokens: Some(spent),
                    stop_tokens: Some(stop),
                },
            });
        }
        room.tokens = stop - spent;
        if room.binding.is_none() {
            room.binding = Some(Stopped {
                at: now,
                limit: Some("autopilot.budget.trace.tokens".to_owned()),
                spend_usd: budget.baseline_usd + live.trace_usd,
                stop_usd: 0.0,
                spend_tokens: Some(spent),
                stop_tokens: Some(stop),
            });
        }
    }
    Ok(room)
}

#[cfg(test)]
#[allow(clippy::cast_precision_loss, reason = "a body of a few bytes")]
mod tests {
    use super::*;
    use crate::proxy::grant::PeriodBudget;

    #[test]
    fn the_worst_case_is_the_maximum_output_and_a_token_a_byte() {
        let prices = ProxyPrices::default();
        let body = br#"{"model":"claude-sonnet-4-5","max_tokens":1000,"messages":[]}"#;
        let worst = worst_case(
            &prices,
            Provider::Anthropic,
            Some("claude-sonnet-4-5"),
            body,
        );
        let input = body.len() as f64;
        // $3 in (at the 1-hour cache-write factor), $15 out.
        let expected = input * 3.0 * CLAUDE_CACHE_WRITE_1H_FACTOR / 1e6 + 1000.0 * 15.0 / 1e6;
        assert!((worst.usd - expected).abs() < 1e-12, "{worst:?}");
        assert_eq!(worst.tokens, body.len() as u64 + 1000);
        let none = worst_case(
            &prices,
            Provider::Openai,
            Some("gpt-5"),
            br#"{"model":"gpt-5"}"#,
        );
        assert_eq!(none.tokens, 17 + DEFAULT_MAX_OUTPUT_TOKENS);
        let capped = worst_case(
            &prices,
            Provider::Openai,
            Some("gpt-5"),
            br#"{"model":"gpt-5","max_output_tokens":10}"#,
        );
        assert_eq!(capped.tokens, 40 + 10);
    }

    #[test]
    fn every_stop_limit_counts_baselines_ledgers_and_reservations() {
        let today = Utc::now().format("%Y-%m-%d").to_string();
        let budget = GrantBudget {
            stop_usd: Some(1.0),
            baseline_usd: 0.25,
            stop_tokens: Some(1000),
            baseline_tokens: 100,
            day: Some(PeriodBudget {
                period: today.clone(),
                stop_usd: 10.0,
                baseline_usd: 9.0,
            }),
            month: None,
        };
        let live = LiveSpend {
            trace_usd: 0.25,
            trace_tokens: 400,
            all_usd: 0.5,
        };
        let mut in_flight = InFlight {
            trace_usd: 0.25,
            trace_tokens: 100,
            all_usd: 0.2,
            trace_requests: 1,
            trace_partial: 0,
            all_partial: 0,
        };
        let left = room(&budget, &live, &in_flight).expect("room");
        assert!((left.usd - 0.25).abs() < 1e-12, "{left:?}");
        assert_eq!(left.tokens, 400);
        // The day is tighter once the others spend.
        in_flight.all_usd = 0.45;
        let left = room(&budget, &live, &in_flight).expect("room");
        assert!((left.usd - 0.05).abs() < 1e-9, "{left:?}");
        in_flight.all_usd = 0.5;
        let over = room(&budget, &live, &in_flight).expect_err("the day is spent");
        assert_eq!(
            over.stopped.limit.as_deref(),
            Some("autopilot.budget.day.usd")
        );
        // A day's baseline of another day does not count.
        let yesterday = GrantBudget {
            day: Some(PeriodBudget {
                period: "2000-01-01".into(),
                stop_usd: 10.0,
                baseline_usd: 9.9,
            }),
            ..budget.clone()
        };
        assert!(room(&yesterday, &live, &in_flight).is_ok());
        // The tokens: reserved ones count.
        in_flight.all_usd = 0.0;
        in_flight.trace_tokens = 500;
        let over = room(&budget, &live, &in_flight).expect_err("the tokens are spent");
        assert_eq!(over.stopped.spend_tokens, Some(1000));
        assert!(
            over.reason.contains("1000 of 1000 tokens"),
            "{}",
            over.reason
        );
        assert!(
            over.reason.contains("reserved by 1 request(s) in flight"),
            "{}",
            over.reason
        );
    }

    #[test]
    fn requests_in_flight_count_for_their_own_store_only() {
        let table = Arc::new(Reservations::default());
        let trace = Uuid::new_v4();
        let (a, b) = (Path::new("/d/proxy/repo-a"), Path::new("/d/proxy/repo-b"));
        let held = table.hold(Held {
            store: a.to_owned(),
            trace,
            usd: 5.0,
            tokens: 10,
            partial: true,
        });
        let of_a = table.in_flight(a, trace);
        assert!((of_a.all_usd - 5.0).abs() < 1e-9 && of_a.all_partial == 1);
        assert_eq!(of_a.trace_requests, 1);
        let of_b = table.in_flight(b, Uuid::new_v4());
        assert!(
            of_b.all_usd.abs() < 1e-9 && of_b.all_partial == 0,
            "{of_b:?}"
        );
        drop(held);
        assert!(table.in_flight(a, trace).all_usd.abs() < 1e-9);
    }
}
