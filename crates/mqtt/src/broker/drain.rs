//! What a stopping broker still owes its connected clients: the messages queued for them.
//!
//! Stopping kicks every session with a clean start, which throws away whatever its session
//! still holds: the messages waiting in its channel and delivery queue (a client with a small
//! receive window takes one answer at a time) and the ones sent but not acknowledged. An
//! answer the service routed before stopping would be lost with them, though its request was
//! acknowledged. So before the kick, [`deliver_queued`] waits until every connected client has
//! taken (and, at QoS 1, acknowledged) all that was queued for it, or the deadline passes.
//!
//! Why a barrier first: routing an answer only puts it in the session's channel; the session's
//! own task moves it to the delivery queue later. An empty queue seen before that would say
//! nothing. An empty `Subscribes` sent down the same channel is answered by the session's task
//! once everything queued before it has moved to the delivery queue (the channel is FIFO).

use std::sync::Arc;

use async_trait::async_trait;
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::session::Session;
use rmqtt::shared::Entry;
use rmqtt::types::Message;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// Wakes the waiter whenever a delivery moves: a message sent, acknowledged or dropped, or a
/// client gone.
struct Progress(Arc<Notify>);

#[async_trait]
impl Handler for Progress {
    async fn hook(&self, _param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        self.0.notify_waiters();
        (true, acc)
    }
}

/// Waits until every client connected to the broker of `scx` has taken what is queued for it,
/// or `deadline` passes; `false` then. Clients that disconnect meanwhile are not waited for
/// (their sessions go with the broker anyway).
pub(crate) async fn deliver_queued(scx: &ServerContext, deadline: Instant) -> bool {
    let progress = Arc::new(Notify::new());
    let hooks = scx.extends.hook_mgr().register();
    for typ in [
        Type::MessageDelivered,
        Type::MessageAcked,
        Type::MessageDropped,
        Type::ClientDisconnected,
    ] {
        hooks.add(typ, Box::new(Progress(progress.clone()))).await;
    }
    hooks.start().await;
    let done = tokio::time::timeout_at(deadline, wait_for_queues(scx, &progress))
        .await
        .is_ok();
    hooks.stop().await;
    done
}

async fn wait_for_queues(scx: &ServerContext, progress: &Notify) {
    let entries: Vec<Box<dyn Entry>> = scx.extends.shared().await.iter().collect();
    let mut sessions = Vec::with_capacity(entries.len());
    for entry in entries {
        if !entry.is_connected().await {
            continue;
        }
        let (Some(session), Some(tx)) = (entry.session(), entry.tx()) else {
            continue;
        };
        let (barrier, passed) = oneshot::channel();
        if tx
            .unbounded_send(Message::Subscribes(Vec::new(), Some(barrier)))
            .is_ok()
        {
            sessions.push((session, passed));
        }
    }
    let mut connected = Vec::with_capacity(sessions.len());
    for (session, passed) in sessions {
        // An error: the session ended before the barrier; nothing left to wait for there.
        if passed.await.is_ok() {
            connected.push(session);
        }
    }
    loop {
        let moved = progress.notified();
        tokio::pin!(moved);
        // Registered before looking: a delivery that moves while we look still wakes us.
        moved.as_mut().enable();
        if all_taken(&connected).await {
            return;
        }
        moved.await;
    }
}

/// Whether each session's client has taken everything: nothing waits in its delivery queue
/// and nothing sent awaits its acknowledgement (or the client is gone).
async fn all_taken(sessions: &[Session]) -> bool {
    for s in sessions {
        if !s.connected().await.unwrap_or(false) {
            continue;
        }
        if !s.deliver_queue().is_empty() || !s.out_inflight().read().await.is_empty() {
            return false;
        }
    }
    true
}
