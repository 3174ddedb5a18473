//! Readiness ([`stategate_engine::health`], re-exported) and the gRPC health service
//! (`grpc.health.v1`) kept in step with it.

use std::time::Duration;

pub use stategate_engine::health::*;

/// How often the gRPC health service re-checks readiness.
pub const GRPC_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Sets every service's status in the gRPC health service.
pub async fn report(reporter: &tonic_health::server::HealthReporter, services: &[&'static str], ready: bool) {
    let status = match ready {
        true => tonic_health::ServingStatus::Serving,
        false => tonic_health::ServingStatus::NotServing,
    };
    for s in std::iter::once("").chain(services.iter().copied()) {
        reporter.set_service_status(s, status).await;
    }
}

/// Reports readiness now (at the end of startup, so that a check made once `start` returned
/// sees it), then keeps the gRPC health service in step, re-checking every
/// [`GRPC_HEALTH_INTERVAL`], until shutdown begins: then every service is not serving.
pub async fn drive_grpc_health(
    obs: Observe,
    reporter: tonic_health::server::HealthReporter,
    services: &'static [&'static str],
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut last = obs.readiness().await.ready();
    report(&reporter, services, last).await;
    async move {
        loop {
            tokio::select! {
                _ = obs.stopped() => {
                    report(&reporter, services, false).await;
                    return;
                }
                _ = tokio::time::sleep(GRPC_HEALTH_INTERVAL) => {}
            }
            let ready = obs.readiness().await.ready();
            if ready != last {
                report(&reporter, services, ready).await;
                last = ready;
            }
        }
    }
}
