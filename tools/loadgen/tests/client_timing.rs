//! The streaming client measures what a user sees: first content, pacing, token counts.

mod common;

use std::time::{Duration, Instant};

use common::Behavior;
use loadgen::client::{execute, Endpoint, EndpointKind};
use loadgen::record::ErrorKind;
use loadgen::source::Job;
use tokio::sync::watch;

fn job(input_tokens: u32, max_tokens: u32) -> Job {
    Job {
        id: 7,
        lane: Some(0),
        session: Some(3),
        conversation: Some(5),
        input_tokens,
        max_tokens,
        hash_ids: vec![1, 2],
        block_size: 64,
        prefix_salt: 11,
        warmup: false,
        send_at: 0.0,
    }
}

fn endpoint(url: String, kind: EndpointKind) -> Endpoint {
    Endpoint {
        base_url: url,
        kind,
        model: "mock".into(),
        token_ids: false,
        request_timeout: Duration::from_secs(60),
    }
}

async fn one(
    behavior: Behavior,
    kind: EndpointKind,
    job: &Job,
) -> (loadgen::record::RequestRecord, common::MockServer) {
    let mock = common::start(move |_| behavior, None).await;
    let (_tx, rx) = watch::channel(false);
    let rec = execute(
        &reqwest::Client::new(),
        &endpoint(mock.url(), kind),
        job,
        Instant::now(),
        None,
        rx,
    )
    .await;
    (rec, mock)
}

#[tokio::test]
async fn ttft_is_taken_at_the_first_content_chunk_not_the_empty_role_chunk() {
    // The role chunk goes out at once; the first token 400 ms later.
    let (rec, _m) = one(Behavior::stream(400, 1), EndpointKind::Chat, &job(32, 4)).await;
    assert!(rec.ok(), "{:?}", rec.error);
    let ttft = rec.ttft_ms.expect("a TTFT");
    assert!(ttft >= 400.0, "TTFT {ttft} ms counted the role chunk");
    assert!(ttft < 10_000.0, "TTFT {ttft} ms");
    assert_eq!(rec.content_chunks, 4, "the role chunk is not content");
}

#[tokio::test]
async fn inter_chunk_gaps_are_measured_between_content_chunks() {
    let gap = 60.0;
    let (rec, _m) = one(
        Behavior::stream(0, 60),
        EndpointKind::Completions,
        &job(32, 6),
    )
    .await;
    assert!(rec.ok(), "{:?}", rec.error);
    assert_eq!(
        rec.chunk_gaps_ms.len(),
        5,
        "one gap between each pair of 6 content chunks"
    );
    // Chunks may coalesce on a busy machine, so check the total, with generous slack.
    let total: f64 = rec.chunk_gaps_ms.iter().sum();
    assert!(total >= 0.5 * 5.0 * gap, "gaps {:?}", rec.chunk_gaps_ms);
    let itl = rec.inter_token_latency_ms().expect("an ITL");
    assert!(itl >= 0.5 * gap, "ITL {itl} ms");
}

#[tokio::test]
async fn output_tokens_come_from_the_usage_chunk_else_from_the_chunk_count() {
    let packed = |usage| Behavior::Stream {
        first_token_delay: Duration::ZERO,
        inter_chunk_delay: Duration::from_millis(1),
        role_chunk: false,
        tokens_per_chunk: 4,
        usage,
    };
    let (with_usage, _m) = one(packed(true), EndpointKind::Completions, &job(8, 16)).await;
    assert_eq!(with_usage.content_chunks, 4);
    assert_eq!(with_usage.output_tokens(), 16, "usage says 16");
    let (without, _m) = one(packed(false), EndpointKind::Completions, &job(8, 16)).await;
    assert_eq!(
        without.output_tokens(),
        4,
        "fallback: one token per content chunk"
    );
}

#[tokio::test]
async fn the_request_asks_for_exactly_the_recorded_shape() {
    let (rec, mock) = one(
        Behavior::stream(0, 0),
        EndpointKind::Completions,
        &job(300, 5),
    )
    .await;
    assert!(rec.ok(), "{:?}", rec.error);
    let seen = mock.seen();
    assert_eq!(seen.len(), 1);
    let b = &seen[0].body;
    assert_eq!(seen[0].path, "/v1/completions");
    assert_eq!(b["max_tokens"], 5);
    assert_eq!(b["ignore_eos"], true);
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["model"], "mock");
    let prompt = b["prompt"].as_str().expect("a text prompt");
    assert_eq!(prompt.split_whitespace().count(), 300);
}

#[tokio::test]
async fn chat_requests_carry_the_prompt_as_one_user_message() {
    let (_rec, mock) = one(Behavior::stream(0, 0), EndpointKind::Chat, &job(50, 2)).await;
    let b = &mock.seen()[0].body;
    assert_eq!(mock.seen()[0].path, "/v1/chat/completions");
    assert_eq!(b["messages"][0]["role"], "user");
    assert_eq!(
        b["messages"][0]["content"]
            .as_str()
            .map(|s| s.split_whitespace().count()),
        Some(50)
    );
}

#[tokio::test]
async fn failures_are_classified_by_kind() {
    let (rec, _m) = one(Behavior::Status(500), EndpointKind::Completions, &job(8, 4)).await;
    let e = rec.error.expect("an error");
    assert_eq!(
        (e.kind, e.status, e.key().as_str()),
        (ErrorKind::Http, Some(500), "http_500")
    );

    let (rec, _m) = one(
        Behavior::DropAfter(2),
        EndpointKind::Completions,
        &job(8, 4),
    )
    .await;
    assert_eq!(rec.error.map(|e| e.kind), Some(ErrorKind::DroppedStream));
    assert_eq!(rec.content_chunks, 2, "chunks before the drop are kept");

    let (rec, _m) = one(Behavior::ErrorEvent, EndpointKind::Completions, &job(8, 4)).await;
    assert_eq!(rec.error.map(|e| e.kind), Some(ErrorKind::StreamError));

    let (_tx, rx) = watch::channel(false);
    let ep = endpoint(common::closed_port_url().await, EndpointKind::Completions);
    let rec = execute(
        &reqwest::Client::new(),
        &ep,
        &job(8, 4),
        Instant::now(),
        None,
        rx,
    )
    .await;
    assert_eq!(rec.error.map(|e| e.kind), Some(ErrorKind::Connect));
}

#[tokio::test]
async fn a_request_past_its_timeout_counts_as_a_timeout() {
    let mock = common::start(|_| Behavior::Hang, None).await;
    let mut ep = endpoint(mock.url(), EndpointKind::Completions);
    ep.request_timeout = Duration::from_millis(200);
    let (_tx, rx) = watch::channel(false);
    let rec = execute(
        &reqwest::Client::new(),
        &ep,
        &job(8, 4),
        Instant::now(),
        None,
        rx,
    )
    .await;
    assert_eq!(rec.error.map(|e| e.kind), Some(ErrorKind::Timeout));
}

#[tokio::test]
async fn token_id_prompts_carry_exactly_the_recorded_number_of_ids() {
    let mock = common::start(|_| Behavior::stream(0, 0), None).await;
    let mut ep = endpoint(mock.url(), EndpointKind::Completions);
    ep.token_ids = true;
    let (_tx, rx) = watch::channel(false);
    let rec = execute(
        &reqwest::Client::new(),
        &ep,
        &job(129, 2),
        Instant::now(),
        None,
        rx,
    )
    .await;
    assert!(rec.ok(), "{:?}", rec.error);
    let prompt = mock.seen()[0].body["prompt"].clone();
    let ids = prompt.as_array().expect("a token-id array");
    assert_eq!(ids.len(), 129);
    assert!(ids.iter().all(|v| v.as_u64().is_some()));
}

#[tokio::test]
async fn a_cancelled_request_keeps_what_it_measured_before_the_cancel() {
    // First token at once, then the stream stalls for longer than the test waits.
    let mock = common::start(|_| Behavior::stream(0, 60_000), None).await;
    let ep = endpoint(mock.url(), EndpointKind::Completions);
    let (tx, rx) = watch::channel(false);
    let j = job(8, 3);
    let task = tokio::spawn(async move {
        execute(&reqwest::Client::new(), &ep, &j, Instant::now(), None, rx).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.send(true).expect("cancel");
    let rec = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("cancel is prompt")
        .expect("join");
    assert_eq!(rec.error.map(|e| e.kind), Some(ErrorKind::Cancelled));
    assert!(
        rec.ttft_ms.is_some(),
        "the first token arrived before the cancel"
    );
    assert_eq!(rec.content_chunks, 1);
}
