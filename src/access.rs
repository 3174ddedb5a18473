//! Who may call, decided once for every door. For now: the shared API token of the HTTP and
//! gRPC doors (`dapr-api-token`).

use subtle::ConstantTimeEq;

/// Whether `given` is the configured token, compared in constant time (a caller timing the
/// answer learns nothing about how much of its guess was right).
pub fn token_matches(expected: &str, given: Option<&str>) -> bool {
    let Some(given) = given else {
        return false;
    };
    // Lengths differ: still compare something of the same cost before saying no.
    if given.len() != expected.len() {
        let _ = expected.as_bytes().ct_eq(expected.as_bytes());
        return false;
    }
    expected.as_bytes().ct_eq(given.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(token_matches("s3cret", Some("s3cret")));
        assert!(!token_matches("s3cret", Some("s3creT")));
        assert!(!token_matches("s3cret", Some("s3cre")));
        assert!(!token_matches("s3cret", Some("")));
        assert!(!token_matches("s3cret", None));
    }
}
