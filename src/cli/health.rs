//! `inferno health`: asks a running service's `grpc.health.v1` whether it is serving, and
//! exits 0 only if it is: a probe for container health checks and scripts that needs no
//! grpcurl (and, like health itself, no token).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// The service's address (https:// with --tls-ca for a server that speaks TLS).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Service to ask about: "" for the server as a whole, or inferno.v1.Inference.
    #[arg(long, default_value = "")]
    pub service: String,
    /// CA certificate (PEM) that signed the server's TLS certificate.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// How long to wait for the answer (e.g. 3s).
    #[arg(long, default_value = "5s", value_parser = super::serve::parse_duration)]
    pub timeout: Duration,
}

pub fn cmd_health(a: HealthArgs) -> Result<()> {
    let mut endpoint = Endpoint::from_shared(a.addr.clone())
        .context("invalid --addr")?
        .connect_timeout(a.timeout)
        .timeout(a.timeout);
    if let Some(ca) = &a.tls_ca {
        let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .context("invalid TLS settings")?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let status = runtime.block_on(async {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {}", a.addr))?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: a.service.clone(),
            })
            .await
            .with_context(|| format!("health check of {} failed", a.addr))?;
        Ok::<_, anyhow::Error>(reply.into_inner().status())
    })?;
    let name = status.as_str_name();
    if status != ServingStatus::Serving {
        bail!("{} is {name}", a.addr);
    }
    println!("{name}");
    Ok(())
}
