//! The labels of the state topics mirror's counters (`--state-topics`).

/// What the state topics mirror did with one change of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateTopicOutcome {
    Published,
    /// The key cannot be a topic (`+`, `#`, NUL, empty levels, not UTF-8, too long).
    Skipped,
    /// Behind an external broker, a key an anonymous caller may not read is not mirrored.
    Withheld,
    /// Older than what the topic already carries (a republish after dropped changes read a
    /// newer value): publishing it would leave the topic stale.
    Superseded,
}

/// What the embedded broker's retained state replays (one per SUBSCRIBE to state topics) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateTopicReplay {
    /// Retained messages put in subscribers' sessions (readable and matching only).
    Queued,
    /// Entries of the retained store read to find them.
    Examined,
    /// Replays stopped at the most messages one SUBSCRIBE may deliver.
    Truncated,
    /// SUBSCRIBEs that got no replay: their client already had as many running as allowed.
    Refused,
}

impl StateTopicReplay {
    pub(super) fn label(self) -> &'static str {
        match self {
            StateTopicReplay::Queued => "queued",
            StateTopicReplay::Examined => "examined",
            StateTopicReplay::Truncated => "truncated",
            StateTopicReplay::Refused => "refused",
        }
    }
}

impl StateTopicOutcome {
    pub(super) fn label(self) -> &'static str {
        match self {
            StateTopicOutcome::Published => "published",
            StateTopicOutcome::Skipped => "skipped",
            StateTopicOutcome::Withheld => "withheld",
            StateTopicOutcome::Superseded => "superseded",
        }
    }
}

/// How the state topics mirror's read of what an external broker retained under its prefix
/// went (at start, and after dropped changes): its stale topics are cleared only after a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainedRead {
    Read,
    /// The broker refused the subscription the read needs (its ACL): nothing was cleared.
    Refused,
    /// No answer in time, or no connection: nothing was cleared.
    Failed,
}

impl RetainedRead {
    pub(super) fn label(self) -> &'static str {
        match self {
            RetainedRead::Read => "read",
            RetainedRead::Refused => "refused",
            RetainedRead::Failed => "failed",
        }
    }
}
