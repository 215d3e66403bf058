//! The service: two front-ends over one engine thread ([`core`]): gRPC
//! (`inferno.v1.Inference`, [`service`], with `grpc.health.v1` health and server reflection
//! v1 and v1alpha) and the OpenAI-compatible HTTP API ([`http`]), which also serves
//! `/metrics` and the probes (as does the optional separate metrics address). Both share
//! the bearer-token check ([`auth`]), Prometheus metrics ([`metrics`]), optional TLS
//! ([`tls`]), connection limits ([`conn`]) and graceful shutdown.

pub mod auth;
pub mod conn;
pub mod core;
pub mod http;
pub mod metrics;
pub mod service;
pub mod tls;

/// The generated protobuf messages, client and server of `inferno.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("inferno.v1");

    /// The encoded descriptor set of `proto/inferno/v1/`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/inferno_v1_descriptor.bin"));
}

use crate::engine::{Engine, EngineAssets, EngineConfig, EngineState, Observer};
use auth::BearerAuth;
use conn::{ConnLimits, Registry, TrackRequests};
use core::{Core, HandlerLimits};
use metrics::Metrics;
use pb::inference_server::InferenceServer;
use service::InferenceService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Routes;
use tonic::transport::{Identity, ServerTlsConfig};
use tonic_health::ServingStatus;
use tracing::{info, warn};

pub use tls::{TlsError, TlsPem};

/// How often an open connection is pinged, and how long the answer may take before the
/// connection is dropped: a client that vanished without closing is noticed in about a
/// minute even while its stream is open.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How the service runs.
#[derive(Clone)]
pub struct ServerConfig {
    /// Where gRPC listens (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Where Prometheus metrics are served over HTTP, if anywhere (they are also at
    /// `/metrics` of the HTTP API).
    pub metrics_addr: Option<SocketAddr>,
    /// Where the OpenAI-compatible HTTP API listens, if anywhere (port 0 picks a free one).
    pub http_listen: Option<SocketAddr>,
    /// The model's id in the HTTP API; `None`: the file's `general.name`, else its stem.
    pub served_model_name: Option<String>,
    pub engine: EngineConfig,
    /// How long in-flight requests may run after shutdown begins before they are cancelled.
    pub drain_timeout: Duration,
    /// Bearer token every call except health must carry.
    pub auth_token: Option<String>,
    pub tls: Option<TlsPem>,
    /// Largest encoded request or response message.
    pub max_message_bytes: usize,
    /// `max_tokens` of a Generate request that does not set it.
    pub default_max_tokens: usize,
    /// Largest text one call may tokenize (Tokenize text, Generate prompt or messages).
    pub max_text_bytes: usize,
    /// Tokenize, Detokenize and prompt preparations run at once (off the network threads).
    pub cpu_jobs: usize,
    /// Open client connections at most, gRPC and HTTP together.
    pub max_connections: usize,
    /// How long a new connection may take to send its first request (TLS and HTTP/2
    /// handshakes included), and an HTTP request its headers and body.
    pub handshake_timeout: Duration,
    /// How long a connection with no open request is kept.
    pub idle_timeout: Duration,
    /// Memory for the Responses API's kept responses; 0 keeps none.
    pub responses_store_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_addr: None,
            http_listen: None,
            served_model_name: None,
            engine: EngineConfig::default(),
            drain_timeout: Duration::from_secs(30),
            auth_token: None,
            tls: None,
            max_message_bytes: 4 * 1024 * 1024,
            default_max_tokens: 256,
            max_text_bytes: 1024 * 1024,
            cpu_jobs: 2,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            responses_store_bytes: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the engine thread: {0}")]
    EngineThread(std::io::Error),
    #[error("invalid TLS configuration: {0}")]
    Tls(#[from] TlsError),
    #[error("invalid TLS configuration: {0}")]
    TlsSetup(tonic::transport::Error),
    #[error("{0}")]
    ModelLoad(Arc<str>),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// How often the drain checks whether the engine has finished its requests.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// A running service, started by [`start`].
pub struct RunningServer {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// The address gRPC listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address metrics are served on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The address the HTTP API listens on.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics' text exposition, as `/metrics` serves it.
    pub fn metrics_text(&self) -> String {
        self.metrics
            .render(self.engine.queue_depth(), self.engine.queue_capacity())
    }

    /// Follows the engine's state (loading, ready, failed).
    pub fn engine_state(&self) -> watch::Receiver<EngineState> {
        self.engine.subscribe()
    }

    /// Drains and stops: no new calls, in-flight requests finish (up to the drain timeout,
    /// then they are cancelled), and the engine thread ends.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.wait().await
    }

    /// Waits until the server stops (after [`shutdown`](Self::shutdown) or a fatal error).
    pub async fn wait(self) -> Result<(), ServerError> {
        let r = self.task.await;
        let engine = Arc::clone(&self.engine);
        engine.cancel_all();
        // Joining blocks; the engine stops within one decode step once cancelled.
        let _ = tokio::task::spawn_blocking(move || engine.join()).await;
        r?
    }

    /// Serves until `signal` resolves (e.g. [`shutdown_signal`]), then shuts down as
    /// [`shutdown`](Self::shutdown) does. Returns early if the server fails, and with
    /// [`ServerError::ModelLoad`] if the model fails to load: a server that can never serve
    /// should exit, so that whatever supervises it restarts it or reports the error.
    pub async fn serve_until(
        mut self,
        signal: impl Future<Output = ()>,
    ) -> Result<(), ServerError> {
        let mut state = self.engine.subscribe();
        let load_failed = async move {
            loop {
                if let EngineState::Failed(e) = &*state.borrow_and_update() {
                    return Arc::clone(e);
                }
                if state.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = signal => self.shutdown().await,
            e = load_failed => {
                self.shutdown().await?;
                Err(ServerError::ModelLoad(e))
            }
            r = &mut self.task => {
                self.engine.cancel_all();
                let engine = Arc::clone(&self.engine);
                let _ = tokio::task::spawn_blocking(move || engine.join()).await;
                r?
            }
        }
    }
}

/// Binds the listeners, starts the engine thread (which runs `loader` to load the model)
/// and serves until [`RunningServer::shutdown`]. Health reports NOT_SERVING until the model
/// is loaded.
pub async fn start(
    config: ServerConfig,
    loader: impl FnOnce() -> Result<EngineAssets, String> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: config.listen,
        source,
    })?;
    let (metrics_listener, metrics_addr) = bind_optional(config.metrics_addr).await?;
    let (http_listener, http_addr) = bind_optional(config.http_listen).await?;
    let http_tls = match &config.tls {
        Some(tls) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
            tls.server_config()?,
        ))),
        None => None,
    };

    let metrics = Arc::new(Metrics::new());
    let observer: Arc<dyn Observer> = Arc::clone(&metrics) as Arc<dyn Observer>;
    let engine = Arc::new(
        Engine::start(config.engine.clone(), loader, observer)
            .map_err(ServerError::EngineThread)?,
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_not_serving::<InferenceServer<InferenceService>>()
        .await;

    let auth = BearerAuth::new(config.auth_token.as_deref(), Arc::clone(&metrics));
    let core = Arc::new(Core::new(
        Arc::clone(&engine),
        Arc::clone(&metrics),
        HandlerLimits {
            default_max_tokens: config.default_max_tokens,
            max_text_bytes: config.max_text_bytes,
            cpu_jobs: config.cpu_jobs,
        },
    ));
    let inference = InferenceServer::new(InferenceService::new(Arc::clone(&core)))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    if let Some(tls) = &config.tls {
        tls.check()?;
        builder = builder
            .tls_config(
                ServerTlsConfig::new()
                    .identity(Identity::from_pem(&tls.cert, &tls.key))
                    .timeout(config.handshake_timeout),
            )
            .map_err(ServerError::TlsSetup)?;
    }
    let routes = Routes::new(health_service)
        .add_service(InterceptedService::new(inference, auth.clone()))
        .add_service(InterceptedService::new(reflection_v1, auth.clone()))
        .add_service(InterceptedService::new(reflection_v1alpha, auth.clone()))
        .prepare();

    // Health follows the engine: SERVING once the model is loaded.
    let mut state = engine.subscribe();
    let ready_health = health.clone();
    let (drain_tx, mut drain_rx) = watch::channel(false);
    let (named_metrics, model_name) = (Arc::clone(&metrics), config.served_model_name.clone());
    tokio::spawn(async move {
        let mut draining = false;
        loop {
            let ready = match &*state.borrow_and_update() {
                EngineState::Ready(served) => {
                    named_metrics.set_model_name(&http::model_id(model_name.as_deref(), served));
                    true
                }
                _ => false,
            };
            draining = draining || *drain_rx.borrow_and_update();
            let status = if ready && !draining {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            ready_health.set_service_status("", status).await;
            ready_health
                .set_service_status(
                    <InferenceServer<InferenceService> as tonic::server::NamedService>::NAME,
                    status,
                )
                .await;
            if let EngineState::Failed(e) = &*state.borrow() {
                warn!(error = %e, "the model failed to load; health stays NOT_SERVING");
            }
            tokio::select! {
                r = state.changed() => if r.is_err() { break },
                r = drain_rx.changed() => if r.is_err() { break },
            }
        }
    });

    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let http_state = Arc::new(http::HttpState {
        core,
        auth,
        served_model_name: config.served_model_name.clone(),
        max_body_bytes: config.max_message_bytes,
        body_timeout: config.handshake_timeout,
        draining: drain_tx.subscribe(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        responses: Arc::new(http::responses::store::ResponseStore::new(
            config.responses_store_bytes,
        )),
    });
    // The listeners close once the drain is over (as gRPC's does).
    let (close_tx, close_rx) = watch::channel(false);
    let drain_timeout = config.drain_timeout;
    let drain_engine = Arc::clone(&engine);
    let (begun_tx, begun_rx) = oneshot::channel::<()>();
    // Resolves when the listener is to close: after the drain, so that until then the port
    // still answers (health NOT_SERVING, new calls UNAVAILABLE) rather than refusing.
    let signal = async move {
        // A dropped trigger means no one can ask for a shutdown any more; keep serving.
        if shutdown_rx.await.is_err() {
            std::future::pending::<()>().await;
        }
        info!(?drain_timeout, "shutting down: draining in-flight requests");
        let _ = drain_tx.send(true);
        drain_engine.close();
        let _ = begun_tx.send(());
        let idle = async {
            while !drain_engine.is_idle() {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        };
        if tokio::time::timeout(drain_timeout, idle).await.is_err() {
            warn!("drain timeout passed: cancelling the remaining requests");
        }
        drain_engine.cancel_all();
        let _ = close_tx.send(true);
    };
    let limits = ConnLimits {
        max_connections: config.max_connections.max(1),
        handshake_timeout: config.handshake_timeout,
        idle_timeout: config.idle_timeout,
    };
    // gRPC and HTTP clients share the connection cap; the metrics address has its own.
    let registry = Arc::new(Registry::default());
    let incoming = tokio_stream::wrappers::ReceiverStream::new(conn::accept_loop(
        listener,
        limits,
        Arc::clone(&registry),
    ));
    // What finishes its responses after the listeners close: a stream the drain timeout
    // cut short has already ended.
    let grace = Duration::from_secs(2);
    let http_serve = http_listener.map(|l| {
        http::serve(
            conn::accept_loop(l, limits, Arc::clone(&registry)),
            http::router(Arc::clone(&http_state)),
            http_tls,
            config.handshake_timeout,
            close_rx.clone(),
            grace,
        )
    });
    let metrics_serve = metrics_listener.map(|l| {
        http::serve(
            conn::accept_loop(l, limits, Arc::new(Registry::default())),
            http::metrics_router(Arc::clone(&http_state)),
            None,
            config.handshake_timeout,
            close_rx,
            grace,
        )
    });
    let max_message_bytes = config.max_message_bytes;
    let task = tokio::spawn(async move {
        let grpc = builder.serve_with_incoming_shutdown(
            TrackRequests {
                routes,
                max_message_bytes,
            },
            incoming,
            signal,
        );
        let serve = async move {
            let (r, _, _) = tokio::join!(
                grpc,
                async move {
                    if let Some(h) = http_serve {
                        h.await
                    }
                },
                async move {
                    if let Some(m) = metrics_serve {
                        m.await
                    }
                },
            );
            r
        };
        tokio::pin!(serve);
        // Graceful shutdown waits for every connection to close; a client holding one open
        // (e.g. a health Watch) must not keep the process alive past the drain timeout.
        let hard_stop = async move {
            if begun_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(drain_timeout + Duration::from_secs(2)).await;
        };
        let r = tokio::select! {
            r = &mut serve => r.map_err(ServerError::from),
            _ = hard_stop => {
                warn!("connections still open after the drain timeout; closing them");
                Ok(())
            }
        };
        r
    });
    info!(%addr, "gRPC listening");
    if let Some(h) = http_addr {
        info!(addr = %h, "HTTP listening");
    }
    if let Some(m) = metrics_addr {
        info!(addr = %m, "metrics listening");
    }
    Ok(RunningServer {
        addr,
        metrics_addr,
        http_addr,
        engine,
        metrics,
        shutdown: Some(shutdown_tx),
        task,
    })
}

/// Binds a listener where one is configured, with the address it got.
async fn bind_optional(
    addr: Option<SocketAddr>,
) -> Result<(Option<TcpListener>, Option<SocketAddr>), ServerError> {
    let Some(a) = addr else {
        return Ok((None, None));
    };
    let bind_err = |source| ServerError::Bind { addr: a, source };
    let l = TcpListener::bind(a).await.map_err(bind_err)?;
    let got = l.local_addr().map_err(bind_err)?;
    Ok((Some(l), Some(got)))
}

/// Waits for SIGINT or SIGTERM (Ctrl-C elsewhere).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
