//! `statestore.v1.Election`: leader election on the keys `statestore.v1` serves (no store
//! prefix: the name is the key an MQTT leased lock on that name uses). The rules are in
//! [`crate::dapr::election`], shared with the HTTP door.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::error::{Surface, from_dapr, from_engine};
use super::grant_of;
use super::pb::statestore::v1 as pb;
use crate::dapr::DaprSettings;
use crate::dapr::election::{self, Campaign, Campaigned, Leader, Observed, Outcome};
use crate::engine::Engine;
use crate::hlc::Hlc;

pub struct Election {
    pub(crate) engine: Engine,
    pub(crate) obs: crate::health::Observe,
    /// Who may do what, and the cap on a campaign's wait.
    pub(crate) settings: Arc<DaprSettings>,
}

fn err(e: crate::dapr::DaprError) -> Status {
    from_dapr(Surface::Native, e)
}

fn leader_pb(l: Leader) -> pb::ElectionLeader {
    pb::ElectionLeader {
        holder: l.holder.to_vec(),
        value: l.value.map(|v| v.to_vec()),
        token: l.token.to_string(),
        lease_version: l.lease_version.to_string(),
        expires_at_ms: l.expires_at_ms.unwrap_or(0),
        campaigned: l.campaigned,
    }
}

fn status(o: Outcome) -> pb::ElectionStatusResponse {
    let s = match o {
        Outcome::Done => pb::ElectionStatus::Success,
        Outcome::NoLeader => pb::ElectionStatus::NoLeader,
        Outcome::NotLeader => pb::ElectionStatus::NotLeader,
    };
    pb::ElectionStatusResponse { status: s as i32 }
}

#[tonic::async_trait]
impl pb::election_server::Election for Election {
    async fn campaign(&self, req: Request<pb::CampaignRequest>) -> Result<Response<pb::CampaignResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let c = Campaign {
            key: Bytes::from(r.name),
            holder: Bytes::from(r.holder),
            value: r.value.map(Bytes::from),
            ttl: Duration::from_millis(r.ttl_ms),
            wait: Duration::from_millis(r.wait_ms),
        };
        // The shared layer caps the wait (`--election-max-wait`); a client whose own deadline
        // passes first goes away, and this future is dropped with its wait.
        let answer = election::campaign(&self.engine, &self.settings, &grant, &c)
            .await
            .map_err(err)?;
        Ok(Response::new(match answer {
            Campaigned::Elected(l) => pb::CampaignResponse {
                elected: true,
                leader: Some(leader_pb(l)),
            },
            Campaigned::NotElected(l) => pb::CampaignResponse {
                elected: false,
                leader: l.map(leader_pb),
            },
        }))
    }

    async fn proclaim(
        &self,
        req: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ElectionStatusResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let token: Hlc = r
            .token
            .parse()
            .map_err(|_| Status::invalid_argument("token is not a fencing token"))?;
        let o = election::proclaim(
            &self.engine,
            &grant,
            &Bytes::from(r.name),
            &Bytes::from(r.holder),
            &token,
            &Bytes::from(r.value),
        )
        .await
        .map_err(err)?;
        Ok(Response::new(status(o)))
    }

    async fn resign(&self, req: Request<pb::ResignRequest>) -> Result<Response<pb::ElectionStatusResponse>, Status> {
        let grant = grant_of(&req)?;
        let r = req.into_inner();
        let o = election::resign(&self.engine, &grant, &Bytes::from(r.name), &Bytes::from(r.holder))
            .await
            .map_err(err)?;
        Ok(Response::new(status(o)))
    }

    async fn leader(&self, req: Request<pb::LeaderRequest>) -> Result<Response<pb::LeaderResponse>, Status> {
        let grant = grant_of(&req)?;
        let key = Bytes::from(req.into_inner().name);
        let l = election::leader(&self.engine, &grant, &key).await.map_err(err)?;
        Ok(Response::new(pb::LeaderResponse {
            leader: l.map(leader_pb),
        }))
    }

    type ObserveStream = Pin<Box<dyn Stream<Item = Result<pb::LeaderResponse, Status>> + Send>>;

    async fn observe(&self, req: Request<pb::LeaderRequest>) -> Result<Response<Self::ObserveStream>, Status> {
        let grant = grant_of(&req)?;
        let key = Bytes::from(req.into_inner().name);
        let leaders = election::observe(&self.engine, &grant, key).map_err(err)?;
        let slot = self
            .settings
            .access
            .open_stream(grant.principal())
            .map_err(|e| from_engine(Surface::Native, e))?;
        let stream = leaders.map(move |o| {
            // The stream holds its slot of the caller's stream limit until it ends.
            let _open = &slot;
            match o {
                Observed::Leader(l) => Ok(pb::LeaderResponse {
                    leader: l.map(leader_pb),
                }),
                Observed::Failed(e) => Err(from_engine(Surface::Native, e)),
            }
        });
        // Ends as Watch does: UNAVAILABLE when the service stops, UNAUTHENTICATED when a
        // reload removed the caller's token.
        Ok(Response::new(Box::pin(crate::native::until_stopped(
            &self.obs,
            grant,
            stream,
            "observe again",
        ))))
    }
}
