//! Transactions: several operations on several keys applied all or nothing, each key's rules
//! checked as for a single command (Dapr's state transactions).

use super::*;

impl Engine {
    /// Applies every operation in order, or none. A condition that is not met (an ETag, NX)
    /// fails the whole transaction with [`EngineError::VersionMismatch`]; deleting a missing
    /// key succeeds. Returns one response per operation; observers are told of every change.
    pub async fn transact(&self, ops: Vec<TxOp>) -> Result<Vec<Response>, EngineError> {
        match self.transact_once(&ops).await {
            Err(EngineError::QuotaExceeded) if self.make_room().await? => self.transact_once(&ops).await,
            other => other,
        }
    }

    pub(super) async fn transact_once(&self, ops: &[TxOp]) -> Result<Vec<Response>, EngineError> {
        let l = &self.0.limits;
        for op in ops {
            match op {
                TxOp::Set(s) => self.check_set(s)?,
                TxOp::Del(d) if d.key.is_empty() => return Err(EngineError::EmptyKey),
                TxOp::Del(d) => self.check_skew(d.fencing.as_ref(), || EngineError::FencingTokenSkew)?,
            }
        }
        // Lock every stripe involved, in index order, so two transactions cannot deadlock.
        let mut stripes: Vec<usize> = ops.iter().map(|op| self.stripe(op.key())).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut _guards = Vec::with_capacity(stripes.len());
        for i in stripes {
            _guards.push(self.0.stripes[i].lock().await);
        }
        'attempt: for _ in 0..MAX_SWAP_ATTEMPTS {
            // key -> (version read, current record in this transaction's view)
            let mut view: std::collections::HashMap<Bytes, (Option<Hlc>, Option<Record>)> = Default::default();
            // The stored value is read only for a key some operation compares it with (NEX,
            // rare); the others need the version, deadline and fencing token alone.
            let compared: Vec<&Bytes> = ops
                .iter()
                .filter_map(|o| match o {
                    TxOp::Set(s) if s.condition == SetCondition::IfAbsentOrEqual => Some(&s.key),
                    _ => None,
                })
                .collect();
            for op in ops {
                if !view.contains_key(op.key()) {
                    let value = compared.contains(&op.key());
                    let cur = match self.load_live_marked(op.key(), None, value).await? {
                        Loaded::Record(r) => r,
                        Loaded::Repeated(_) => return Err(contended()),
                    };
                    view.insert(op.key().clone(), (cur.as_ref().map(|r| r.version.clone()), cur));
                }
            }
            let mut changes: Vec<(Change, Option<Record>)> = Vec::with_capacity(ops.len());
            let mut responses = Vec::with_capacity(ops.len());
            for op in ops {
                let Some((_, cur)) = view.get_mut(op.key()) else {
                    continue 'attempt;
                };
                match op {
                    TxOp::Set(s) => {
                        // Inside a transaction an unmet NX/NEX fails everything, like an ETag.
                        let new = self.set_record(s, cur.as_ref())?.ok_or(EngineError::VersionMismatch)?;
                        let version = new.version.clone();
                        *cur = Some(new.clone());
                        let change = Change {
                            key: s.key.clone(),
                            version: version.clone(),
                            kind: ChangeKind::Set(s.value.clone()),
                        };
                        changes.push((change, Some(new)));
                        responses.push(Response::new(Reply::Ok, Some(version)));
                    }
                    TxOp::Del(d) => {
                        if !Self::check_delete(cur.as_ref(), d.fencing.as_ref(), &d.condition)? {
                            responses.push(Response::new(Reply::Int(0), None));
                            continue;
                        }
                        let Some(r) = cur.take() else {
                            continue 'attempt;
                        };
                        let version = self.0.hlc.next_after(&[&r.version]);
                        let change = Change {
                            key: d.key.clone(),
                            version: version.clone(),
                            kind: ChangeKind::Delete,
                        };
                        changes.push((change, None));
                        responses.push(Response::new(Reply::Int(1), Some(version)));
                    }
                }
            }
            let swaps: Vec<Swap> = view
                .into_iter()
                .filter(|(_, (read, cur))| read.as_ref() != cur.as_ref().map(|r| &r.version))
                .map(|(key, (expected, new))| Swap {
                    key,
                    expected,
                    new,
                    deadline: DeadlineCheck::Any,
                })
                .collect();
            // A key the transaction leaves as it found it (set then deleted while absent)
            // changed nothing anyone can read: its intermediate changes are not published.
            changes.retain(|(c, _)| swaps.iter().any(|s| s.key == c.key));
            let outcome = if swaps.is_empty() {
                Written::Done { logged: None }
            } else {
                self.commit(&swaps, l.max_keys, changes, None).await?
            };
            match outcome {
                Written::Done { .. } => return Ok(responses),
                Written::TooManyKeys => return Err(EngineError::QuotaExceeded),
                Written::Conflict | Written::Behind(_) => continue,
                Written::Repeated(_) => return Err(contended()),
            }
        }
        Err(contended())
    }
}
