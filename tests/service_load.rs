//! The engine under concurrent clients: a dropped stream frees the engine, a queued request
//! whose client has gone never starts, and a full queue refuses requests with
//! RESOURCE_EXHAUSTED while every accepted request gets its complete, unduplicated stream.
//! The queue tests run the engine with one sequence slot (`max_seqs` 1), so that a running
//! request makes the others queue; batching itself is tested in `batching.rs`.

mod service_support;

use service_support::*;
use std::time::Duration;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_mid_generation_stops_it_and_frees_the_engine() {
    let server = start_demo(test_config()).await;
    let mut c = client(server.addr()).await;

    let mut long = c.generate(greedy("long", 3000)).await.unwrap().into_inner();
    next_token(&mut long).await;
    next_token(&mut long).await;
    // While it streams: counted as running, its prompt counted, and its tokens counted as
    // they go rather than when it ends.
    assert_eq!(server.metrics().running_streams(), 1);
    assert_eq!(server.metrics().prompt_tokens_total(), "long".len() as u64);
    assert!(server.metrics().tokens_total() >= 2);
    drop(long);

    let r = run(&mut c, greedy("short", 8)).await;
    assert_eq!(r.code(), Code::Ok);
    assert_eq!(r.tokens.len(), 8);

    // The first stopped within a step of its client leaving: far short of its 3000 tokens.
    let m = server.metrics();
    assert_eq!(m.requests("Generate", "CANCELLED"), 1);
    assert_eq!(m.requests("Generate", "OK"), 1);
    let first = m.tokens_total() - 8;
    assert!(
        (2..1000).contains(&first),
        "the dropped request generated {first} tokens"
    );
    assert_eq!(m.running_streams(), 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_left_is_dropped_before_prefill() {
    let mut cfg = test_config();
    cfg.engine.queue_capacity = 1;
    cfg.engine.max_seqs = 1;
    let server = start_demo(cfg).await;
    let mut c = client(server.addr()).await;

    let mut blocker = c
        .generate(greedy("blocker", 3000))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut blocker).await;
    // Fills the queue, then its client goes away.
    let gone = c.generate(greedy("gone", 5)).await.unwrap().into_inner();
    drop(gone);
    // The queue is full until the server notices; then the gone request is shed to make room.
    let mut c2 = client(server.addr()).await;
    let waiting = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match c2.generate(greedy("next", 5)).await {
                Ok(s) => break s.into_inner(),
                Err(s) if s.code() == Code::ResourceExhausted => {
                    assert!(s.message().contains("capacity 1"), "{}", s.message());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(s) => panic!("unexpected {s:?}"),
            }
        }
    })
    .await
    .expect("the gone request is shed (hang guard)");
    drop(blocker);
    let r = collect(waiting).await;
    assert_eq!(r.code(), Code::Ok);
    assert_eq!(r.tokens.len(), 5);

    let m = server.metrics();
    // Only the blocker and the last request ever started.
    assert_eq!(m.queue_wait.count(), 2);
    assert_eq!(m.time_to_first_token.count(), 2);
    assert_eq!(m.requests("Generate", "CANCELLED"), 2);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_with_resource_exhausted_and_accepted_streams_are_complete() {
    let mut cfg = test_config();
    cfg.engine.queue_capacity = 2;
    cfg.engine.max_seqs = 1;
    let server = start_demo(cfg).await;
    let addr = server.addr();
    let mut c = client(addr).await;
    let request = greedy("The queue", 12);
    let alone = run(&mut c, request.clone()).await;
    assert_eq!(alone.code(), Code::Ok);
    assert_eq!(alone.tokens.len(), 12);

    // Hold the engine so that the concurrent requests can only queue.
    let mut blocker = c
        .generate(greedy("blocker", 3000))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut blocker).await;

    let mut calls = Vec::new();
    for _ in 0..6 {
        let req = request.clone();
        calls.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            c.generate(req).await.map(|r| r.into_inner())
        }));
    }
    let mut accepted = Vec::new();
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(stream) => accepted.push(stream),
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(
                    s.message().contains("queue is full (capacity 2)"),
                    "{}",
                    s.message()
                );
                refused += 1;
            }
        }
    }
    assert_eq!(accepted.len(), 2);
    assert_eq!(refused, 4);
    assert_eq!(
        server.metrics().requests("Generate", "RESOURCE_EXHAUSTED"),
        4
    );
    assert_eq!(metric(&server.metrics_text(), "inferno_queue_depth"), 2.0);

    drop(blocker);
    for stream in accepted {
        let r = collect(stream).await;
        assert_eq!(r.code(), Code::Ok);
        let idx: Vec<u32> = r.tokens.iter().map(|t| t.index).collect();
        assert_eq!(
            idx,
            (0..12).collect::<Vec<u32>>(),
            "no token lost or repeated"
        );
        assert_eq!(r.ids(), alone.ids());
        assert_eq!(r.text(), alone.text());
    }
    server.shutdown().await.unwrap();
}
