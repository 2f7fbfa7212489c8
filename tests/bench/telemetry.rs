//! OpenTelemetry export figures: what export adds to closing a span (the outbox append), the
//! conversion of a span into OTLP, and the exporter's throughput to a collector on loopback
//! (an HTTP sink answering every `POST /v1/traces` with an empty `ExportTraceServiceResponse`).

use std::time::{Duration, Instant};

use chrono::Utc;
use rover::config::TelemetryConfig;
use rover::store::{outbox, Action, AutopilotStore, Meta, Span, SpanStatus, StepKind};
use rover::telemetry::{self, convert, ExportSetup, TelemetrySettings};
use serde_json::json;
use uuid::Uuid;

use crate::percentiles;

const CLOSES: usize = 300;
const EXPORTED: usize = 2_000;

/// A finished coordinate span with an agent's figures, as a step writes it.
fn closed_span(trace: Uuid) -> Span {
    let root = Span::root(trace, Utc::now(), Meta::new());
    let action = Action::new(
        StepKind::Coordinate,
        &root,
        "bench",
        Meta::new(),
        Utc::now(),
    );
    let mut span = Span::start(StepKind::Coordinate, &action, trace, Utc::now());
    let meta = json!({"decision": "plan", "decidedBy": "agent", "reasoning": "decided plan",
        "agent": {"turns": 1, "costUsd": 0.01, "inputTokens": 1200, "outputTokens": 80, "cachedTokens": 0}});
    let serde_json::Value::Object(meta) = meta else {
        unreachable!()
    };
    span.finish(SpanStatus::Completed, "decided plan", meta, Utc::now())
        .unwrap();
    span
}

fn close_many(store: &AutopilotStore) -> (f64, f64) {
    let trace = Uuid::new_v4();
    let mut samples = Vec::with_capacity(CLOSES);
    for _ in 0..CLOSES {
        let span = closed_span(trace);
        let t = Instant::now();
        store.write_span(&span).unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    percentiles(samples)
}

pub fn run() {
    println!("\n== telemetry (OpenTelemetry export)");
    let dir = tempfile::tempdir().expect("temp dir");
    let off = AutopilotStore::open(dir.path(), "bench-off").unwrap();
    let on = AutopilotStore::open(dir.path(), "bench-on").unwrap();
    outbox::arm(&on).unwrap();
    // Interleaved rounds, so the disk's moods fall on both alike.
    let (mut off_s, mut on_s) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        off_s.push(close_many(&off));
        on_s.push(close_many(&on));
    }
    let mid = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[1]
    };
    let (off50, off99) = mid(&mut off_s);
    let (on50, on99) = mid(&mut on_s);
    println!("close a span, export off          p50 {off50:>8.0} us   p99 {off99:>8.0} us");
    println!(
        "close a span, export on (outbox)  p50 {on50:>8.0} us   p99 {on99:>8.0} us   {:+.0} us at p50",
        on50 - off50
    );

    // The append alone (what export adds to a close, without the span's own fsyncs).
    let mut appends = Vec::with_capacity(CLOSES * 10);
    for _ in 0..CLOSES * 10 {
        let id = Uuid::new_v4();
        let t = Instant::now();
        outbox::record_closed(&on, id).unwrap();
        appends.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (a50, a99) = percentiles(appends);
    println!("the outbox append alone           p50 {a50:>8.1} us   p99 {a99:>8.1} us");

    let conv = convert::Convert {
        agent: rover::agents::AgentSettings::default(),
        content: false,
        redactor: rover::github::Redactor::default(),
        scope: opentelemetry::InstrumentationScope::builder("rover").build(),
        repo: Some("octo-org/api".into()),
        project_id: "bench-export".into(),
    };
    let span = closed_span(Uuid::new_v4());
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(convert::to_span_data(&span, &conv));
    }
    println!(
        "convert a span to OTLP            {:>8.1} us per span",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(throughput(dir.path()));
}

async fn throughput(dir: &std::path::Path) {
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|| async {
            (
                [("content-type", "application/x-protobuf")],
                Vec::<u8>::new(),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let store = AutopilotStore::open(dir, "bench-export").unwrap();
    let config = TelemetryConfig {
        enabled: true,
        endpoint: Some(format!("http://{addr}")),
        ..TelemetryConfig::default()
    };
    let settings = TelemetrySettings::resolve_with(&config, |_| None).unwrap();
    let t = Instant::now();
    let exporter = telemetry::start(ExportSetup {
        store: store.clone(),
        settings,
        agent: rover::agents::AgentSettings::default(),
        redactor: rover::github::Redactor::default(),
        project_id: "bench-export".into(),
        repo: None,
        host: rover::host_env::HostEnv::from_process(),
        one_of_many: false,
    })
    .await
    .unwrap()
    .expect("export on");
    let trace = Uuid::new_v4();
    let writer = store.clone();
    tokio::task::spawn_blocking(move || {
        for _ in 0..EXPORTED {
            writer.write_span(&closed_span(trace)).unwrap();
        }
    })
    .await
    .unwrap();
    let closed = t.elapsed();
    loop {
        let state = telemetry::state::load(&store).unwrap();
        if state.exported as usize + state.dropped.total() as usize >= EXPORTED {
            let all = t.elapsed();
            println!(
                "export {EXPORTED} spans over HTTP       closing them took {:.2} s; all exported {:.3} s after the last close ({:.0} spans/s end to end), {} dropped",
                closed.as_secs_f64(),
                all.saturating_sub(closed).as_secs_f64(),
                EXPORTED as f64 / all.as_secs_f64(),
                state.dropped.total()
            );
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "export stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exporter.finish().await;
}
