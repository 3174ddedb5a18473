//! The rules of a single-key write: SET (NX, NEX, PX, fencing, skew, quotas) and DEL/VDEL, and
//! GET. Each is decided once here, under the key's stripe lock, for every door and backend.

use super::*;

impl Engine {
    pub(crate) async fn set(&self, c: Set, request: Option<&RequestId>) -> Result<Response, EngineError> {
        match self.set_once(&c, request).await {
            Err(EngineError::QuotaExceeded) if self.make_room().await? => self.set_once(&c, request).await,
            other => other,
        }
    }

    /// The checks of a SET that need no stored state: key, sizes, clock skew.
    pub(crate) fn check_set(&self, c: &Set) -> Result<(), EngineError> {
        let l = &self.0.limits;
        if c.key.is_empty() {
            return Err(EngineError::EmptyKey);
        }
        if c.key.len() > l.max_key_bytes || c.value.len() > l.max_value_bytes {
            return Err(EngineError::TooLarge);
        }
        if c.ttl_ms.is_some_and(|t| t == 0 || t > MAX_TTL_MS) {
            return Err(EngineError::TtlOutOfRange);
        }
        // Only a deadline can slide.
        if c.sliding && c.ttl_ms.is_none() {
            return Err(EngineError::Syntax);
        }
        self.check_skew(c.timestamp.as_ref(), || EngineError::TimestampSkew)?;
        self.check_skew(c.fencing.as_ref(), || EngineError::FencingTokenSkew)?;
        // The storage says what it can keep; no door decides this on its own.
        if c.persist && !self.0.store.backend().persistent() {
            return Err(EngineError::NotPersistent);
        }
        Ok(())
    }

    /// The SET rule over the key's live record: the fencing check, then the condition (an ETag
    /// that does not match is an error; NX/NEX not met is `Ok(None)`), then the new record with
    /// a version past the request's timestamp and the stored version, and the higher token.
    pub(crate) fn set_record(&self, c: &Set, cur: Option<&Record>) -> Result<Option<Record>, EngineError> {
        Self::check_fencing(cur.and_then(|r| r.fencing.as_ref()), c.fencing.as_ref())?;
        let applies = match (&c.condition, cur) {
            (SetCondition::IfVersion(v), Some(r)) if *v == r.version => true,
            (SetCondition::IfVersion(_), _) => return Err(EngineError::VersionMismatch),
            (_, None) | (SetCondition::Always, Some(_)) => true,
            (SetCondition::IfAbsent, Some(_)) => false,
            (SetCondition::IfAbsentOrEqual, Some(r)) => r.value == c.value,
        };
        if !applies {
            return Ok(None);
        }
        // No allocation: one or two floors live on the stack.
        let (two, one);
        let floors: &[&Hlc] = match (c.timestamp.as_ref(), cur.map(|r| &r.version)) {
            (Some(a), Some(b)) => {
                two = [a, b];
                &two
            }
            (Some(a), None) | (None, Some(a)) => {
                one = [a];
                &one
            }
            (None, None) => &[],
        };
        let fencing = match (cur.and_then(|r| r.fencing.clone()), c.fencing.clone()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Ok(Some(Record {
            value: c.value.clone(),
            version: self.0.hlc.next_after(floors),
            fencing,
            expires_at_ms: c.ttl_ms.map(|t| self.0.hlc.wall_ms().saturating_add(t)),
            slide_ms: c.ttl_ms.filter(|_| c.sliding),
        }))
    }

    /// The DEL rule over the key's live record: `Ok(false)` when there is nothing to delete,
    /// an error when the condition or the fencing token refuses it.
    pub(crate) fn check_delete(
        cur: Option<&Record>,
        fencing: Option<&Hlc>,
        condition: &DelCondition,
    ) -> Result<bool, EngineError> {
        let Some(cur) = cur else {
            return match condition {
                DelCondition::IfVersion(_) => Err(EngineError::VersionMismatch),
                DelCondition::Always | DelCondition::IfAbsent => Ok(false),
            };
        };
        Self::check_fencing(cur.fencing.as_ref(), fencing)?;
        match condition {
            DelCondition::IfVersion(v) if *v != cur.version => Err(EngineError::VersionMismatch),
            DelCondition::IfAbsent => Err(EngineError::VersionMismatch),
            DelCondition::Always | DelCondition::IfVersion(_) => Ok(true),
        }
    }

    pub(crate) async fn set_once(&self, c: &Set, request: Option<&RequestId>) -> Result<Response, EngineError> {
        self.check_set(c)?;
        let _guard = self.lock(&c.key).await;
        // Only NEX compares the stored value.
        let value = matches!(c.condition, SetCondition::IfAbsentOrEqual);
        let mut fresh = false;
        for _ in 0..MAX_SWAP_ATTEMPTS {
            let (cur, cached) = match self.start_write(&c.key, request, value, fresh).await? {
                Start::Record { record, cached } => (record, cached),
                Start::Repeated(first) => return Ok(first),
                Start::Stale => {
                    fresh = true;
                    continue;
                }
            };
            let decided = self.set_record(c, cur.as_ref());
            // An answer that swaps nothing stands only if storage still holds what it was
            // decided on.
            if cached && !matches!(decided, Ok(Some(_))) {
                match self.confirm(&c.key, cur.as_ref(), request).await? {
                    Confirmed::Holds => {}
                    Confirmed::Stale => {
                        fresh = true;
                        continue;
                    }
                    Confirmed::Repeated(first) => return Ok(first),
                }
            }
            let Some(new) = decided? else {
                return Ok(Response::new(Reply::NotApplied, cur.map(|r| r.version)));
            };
            let version = new.version.clone();
            let swap = Swap {
                key: c.key.clone(),
                expected: cur.map(|r| r.version),
                new: Some(new.clone()),
                deadline: DeadlineCheck::Any,
            };
            let response = Response::new(Reply::Ok, Some(version.clone()));
            let change = Change {
                key: c.key.clone(),
                version,
                kind: ChangeKind::Set(c.value.clone()),
            };
            let mark = self.mark(request, &response);
            match self
                .commit(
                    std::slice::from_ref(&swap),
                    self.0.limits.max_keys,
                    vec![(change, Some(new))],
                    mark,
                )
                .await?
            {
                Written::Done { .. } => return Ok(response),
                Written::TooManyKeys => return Err(EngineError::QuotaExceeded),
                Written::Conflict | Written::Behind(_) => fresh = true,
                Written::Repeated(first) => return shared::decode_outcome(&first),
            }
        }
        Err(contended())
    }

    pub(crate) async fn get(&self, c: Get) -> Result<Response, EngineError> {
        Ok(match self.read(&c.key).await? {
            None => Response::new(Reply::Nil, None),
            Some(e) => Response::new(Reply::Value(e.value), Some(e.version)),
        })
    }

    pub(crate) async fn delete(
        &self,
        key: Bytes,
        fencing: Option<Hlc>,
        condition: DelCondition,
        if_value: Option<Bytes>,
        request: Option<&RequestId>,
    ) -> Result<Response, EngineError> {
        if key.is_empty() {
            return Err(EngineError::EmptyKey);
        }
        self.check_skew(fencing.as_ref(), || EngineError::FencingTokenSkew)?;
        let _guard = self.lock(&key).await;
        let mut fresh = false;
        for _ in 0..MAX_SWAP_ATTEMPTS {
            let (cur, cached) = match self.start_write(&key, request, if_value.is_some(), fresh).await? {
                Start::Record { record, cached } => (record, cached),
                Start::Repeated(first) => return Ok(first),
                Start::Stale => {
                    fresh = true;
                    continue;
                }
            };
            let decided = Self::decide_delete(cur.as_ref(), fencing.as_ref(), &condition, if_value.as_ref());
            if cached && !matches!(decided, Ok(None)) {
                match self.confirm(&key, cur.as_ref(), request).await? {
                    Confirmed::Holds => {}
                    Confirmed::Stale => {
                        fresh = true;
                        continue;
                    }
                    Confirmed::Repeated(first) => return Ok(first),
                }
            }
            if let Some(answer) = decided? {
                return Ok(answer);
            }
            let Some(cur) = cur else { continue };
            match self.remove(&key, &cur, ChangeKind::Delete, request).await? {
                Removed::Done(version) => return Ok(Response::new(Reply::Int(1), Some(version))),
                Removed::Repeated(first) => return Ok(first),
                Removed::Lost => fresh = true,
            }
        }
        Err(contended())
    }

    /// DEL/VDEL over the key's live record: the answer when nothing is to be deleted (or an
    /// error), `None` when the record goes.
    pub(crate) fn decide_delete(
        cur: Option<&Record>,
        fencing: Option<&Hlc>,
        condition: &DelCondition,
        if_value: Option<&Bytes>,
    ) -> Result<Option<Response>, EngineError> {
        if !Self::check_delete(cur, fencing, condition)? {
            return Ok(Some(Response::new(Reply::Int(0), None)));
        }
        match cur {
            Some(cur) if if_value.is_some_and(|v| *v != cur.value) => {
                Ok(Some(Response::new(Reply::NotApplied, Some(cur.version.clone()))))
            }
            _ => Ok(None),
        }
    }
}
