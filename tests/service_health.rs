//! Health, authentication and shutdown: health is NOT_SERVING while the model loads,
//! SERVING after, NOT_SERVING while draining; the bearer token guards every service but
//! health; shutdown lets in-flight requests finish within the drain timeout and cancels
//! them past it.

mod service_support;

use inferno::server::pb::FinishReason;
use inferno::server::start;
use service_support::*;
use std::time::Duration;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn next_status(
    w: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) -> ServingStatus {
    let m = tokio::time::timeout(Duration::from_secs(120), w.message())
        .await
        .expect("health update (hang guard)")
        .expect("watch ok")
        .expect("watch not ended");
    m.status()
}

fn check(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_loading_ready_and_draining() {
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let loader = move || {
        // The model "loads" until the test lets it finish.
        release_rx.recv().map_err(|e| e.to_string())?;
        demo_loader()()
    };
    let server = start(test_config(), loader).await.unwrap();
    let ch = channel(server.addr()).await;
    let mut health = HealthClient::new(ch.clone());
    for svc in ["", "inferno.v1.Inference"] {
        let s = health
            .check(check(svc))
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(s, ServingStatus::NotServing, "{svc:?} while loading");
    }
    let mut c = inferno::server::pb::inference_client::InferenceClient::new(ch.clone());
    let r = run(&mut c, greedy("too early", 2)).await;
    assert_eq!(r.code(), Code::Unavailable);
    assert!(r.status.unwrap().message().contains("loading"));

    let mut watch = health
        .watch(check("inferno.v1.Inference"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_status(&mut watch).await, ServingStatus::NotServing);
    release_tx.send(()).unwrap();
    assert_eq!(next_status(&mut watch).await, ServingStatus::Serving);
    let s = health.check(check("")).await.unwrap().into_inner().status();
    assert_eq!(s, ServingStatus::Serving);
    let r = run(&mut c, greedy("now", 2)).await;
    assert_eq!(r.code(), Code::Ok);

    let stopping = tokio::spawn(server.shutdown());
    assert_eq!(next_status(&mut watch).await, ServingStatus::NotServing);
    drop(watch);
    drop(c);
    drop(health);
    drop(ch);
    stopping.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_guards_everything_but_health() {
    let mut cfg = test_config();
    cfg.auth_token = Some("s3cret-token".into());
    let server = start_demo(cfg).await;
    let ch = channel(server.addr()).await;

    let mut open = inferno::server::pb::inference_client::InferenceClient::new(ch.clone());
    let r = run(&mut open, greedy("hi", 2)).await;
    assert_eq!(r.code(), Code::Unauthenticated);
    let e = open
        .get_model_info(inferno::server::pb::GetModelInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    let with_token = |token: &'static str| {
        move |mut req: tonic::Request<()>| {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            Ok(req)
        }
    };
    let mut wrong = inferno::server::pb::inference_client::InferenceClient::with_interceptor(
        ch.clone(),
        with_token("guess"),
    );
    let r = run_with(&mut wrong, greedy("hi", 2)).await;
    assert_eq!(r, Code::Unauthenticated);
    let mut right = inferno::server::pb::inference_client::InferenceClient::with_interceptor(
        ch.clone(),
        with_token("s3cret-token"),
    );
    assert_eq!(run_with(&mut right, greedy("hi", 2)).await, Code::Ok);

    // Health needs no token.
    let s = HealthClient::new(ch.clone())
        .check(check(""))
        .await
        .unwrap()
        .into_inner()
        .status();
    assert_eq!(s, ServingStatus::Serving);
    assert_eq!(
        metric(&server.metrics_text(), "inferno_auth_failures_total"),
        3.0
    );
    server.shutdown().await.unwrap();
}

async fn run_with<F>(
    c: &mut inferno::server::pb::inference_client::InferenceClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, F>,
    >,
    req: inferno::server::pb::GenerateRequest,
) -> Code
where
    F: tonic::service::Interceptor,
{
    match c.generate(req).await {
        Ok(s) => collect(s.into_inner()).await.code(),
        Err(s) => s.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_then_cancels_past_the_timeout() {
    // Within the drain timeout: the in-flight request completes normally.
    let server = start_demo(test_config()).await;
    let addr = server.addr();
    let mut c = client(addr).await;
    let mut s = c.generate(greedy("drain", 40)).await.unwrap().into_inner();
    let first = next_token(&mut s).await;
    let stopping = tokio::spawn(server.shutdown());
    let rest = collect(s).await;
    assert_eq!(rest.code(), Code::Ok, "{:?}", rest.status);
    assert_eq!(rest.tokens.len() + 1, 40);
    assert_eq!(first.index, 0);
    assert_eq!(rest.finish_reason(), Some(FinishReason::Length));
    drop(c);
    stopping.await.unwrap().unwrap();

    // Past the drain timeout: the request is cancelled and ends with a non-OK status.
    let mut cfg = test_config();
    cfg.drain_timeout = Duration::from_millis(200);
    let server = start_demo(cfg).await;
    let mut c = client(server.addr()).await;
    let mut s = c
        .generate(greedy("endless", 3000))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut s).await;
    let stopping = tokio::spawn(server.shutdown());
    let rest = collect(s).await;
    assert_eq!(rest.code(), Code::Unavailable, "{:?}", rest.status);
    assert_eq!(rest.finish_reason(), Some(FinishReason::Cancelled));
    assert!(rest.tokens.len() < 2999);
    drop(c);
    stopping.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_tls_clients_only() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/service_support/tls");
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let mut cfg = test_config();
    cfg.tls = Some(inferno::server::TlsPem {
        cert: read("server.pem"),
        key: read("server.key"),
    });
    let server = start_demo(cfg).await;
    let port = server.addr().port();

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")))
        .domain_name("localhost");
    let ch = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS handshake with the test CA");
    let mut c = inferno::server::pb::inference_client::InferenceClient::new(ch);
    let r = run(&mut c, greedy("secure", 3)).await;
    assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
    assert_eq!(r.tokens.len(), 3);

    // A plaintext client gets no service.
    let mut plain = client(server.addr()).await;
    let e = plain
        .get_model_info(inferno::server::pb::GetModelInfoRequest {})
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    server.shutdown().await.unwrap();
}
