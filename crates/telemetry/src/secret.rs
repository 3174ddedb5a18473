//! Secrets in text that may be shown: the one place URLs lose their passwords before they reach
//! a log line, an error or `Debug` output (broker URLs, Redis and Sentinel URLs alike).

/// `url` with the password of its user information replaced by `***`. The user information ends
/// at the last `@` (a password may hold `/`, `?`, `#` or `@` typed unencoded, and a host never
/// holds `@`), so no part of a password survives whatever it contains.
pub fn mask_url_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    match url[scheme_end..].rfind('@').map(|i| scheme_end + i) {
        Some(at) => match url[scheme_end..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end], &url[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `%XX` escapes decoded (a password may hold `@`, `:` or `/`); `None` if malformed.
pub fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::mask_url_password;

    #[test]
    fn no_part_of_a_password_is_shown() {
        for (url, shown) in [
            ("redis://u:pa/ss@h:6379/0", "redis://u:***@h:6379/0"),
            ("redis://:p/w@h", "redis://:***@h"),
            (
                "rediss+sentinel://u:a@b/c?d#e@s1:26379,s2:26379/svc/1",
                "rediss+sentinel://u:***@s1:26379,s2:26379/svc/1",
            ),
            ("mqtts://ops:se:cret@broker:8883", "mqtts://ops:***@broker:8883"),
            ("mqtt://user@broker", "mqtt://user@broker"),
            ("redis://h:6379/0", "redis://h:6379/0"),
            ("not a url", "not a url"),
        ] {
            let masked = mask_url_password(url);
            assert_eq!(masked, shown, "{url}");
        }
    }
}
