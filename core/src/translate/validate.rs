//! Checks for input that Envoy would NACK. A NACK rejects the whole resource (for routes,
//! the one route configuration every virtual host lives in), so each check here keeps one
//! bad virtual host from blocking all the others (I8).

/// Envoy's bound on a header name or value in its configuration (`max_bytes`).
pub const MAX_HEADER_BYTES: usize = 16_384;

/// Envoy's `HTTP_HEADER_VALUE` rule (non-strict): no NUL, CR or LF; and its size bound.
pub fn header_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_HEADER_BYTES {
        return Err(format!(
            "of {} bytes is longer than Envoy's {MAX_HEADER_BYTES}",
            value.len()
        ));
    }
    match value.chars().find(|c| matches!(c, '\0' | '\r' | '\n')) {
        Some(c) => Err(format!("{value:?} contains the forbidden character {c:?}")),
        None => Ok(()),
    }
}

/// A header name: an RFC 9110 token (Envoy accepts more, a space for one, and then every
/// client of the route fails to parse the response: "invalid HTTP header parsed"), or a
/// pseudo-header (`:path`) for matches.
pub fn header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name is empty".to_owned());
    }
    header_value(name).map_err(|e| format!("header name {e}"))?;
    let token = name.strip_prefix(':').unwrap_or(name);
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    match token.chars().find(|c| !is_tchar(*c)) {
        Some(c) => Err(format!(
            "header name {name:?} contains {c:?}: a header name is a token (letters, digits and !#$%&'*+-.^_`|~)"
        )),
        None if token.is_empty() => Err(format!("header name {name:?} is empty after ':'")),
        None => Ok(()),
    }
}

/// A header that a route may add, set or remove: Envoy refuses to modify pseudo-headers
/// and `host` ("':-prefixed' or 'host' headers may not be modified").
pub fn modifiable_header(name: &str) -> Result<(), String> {
    header_name(name)?;
    if name.starts_with(':') || name.eq_ignore_ascii_case("host") {
        return Err(format!("header {name:?} may not be modified"));
    }
    Ok(())
}

/// A regex that Envoy's RE2 engine accepts. Checked with the `regex` crate, whose syntax
/// is close to RE2's, plus the few constructs that only the `regex` crate accepts.
pub fn regex(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("regex is empty".to_owned());
    }
    if let Err(e) = regex::Regex::new(pattern) {
        return Err(format!(
            "regex {pattern:?} does not compile: {}",
            regex_error(&e)
        ));
    }
    if let Some(construct) = not_in_re2(pattern) {
        return Err(format!(
            "regex {pattern:?} uses {construct}, which Envoy's RE2 does not support"
        ));
    }
    Ok(())
}

/// The one-line reason of a regex error (its Display spans several lines).
fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("error: "))
        .map(str::to_owned)
        .unwrap_or_else(|| text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Syntax of the `regex` crate that RE2 rejects: word-boundary assertions `\<`, `\>`,
/// `\b{...}`, set operations inside classes (`&&`, `--`, `~~`), and flags other than
/// `i`, `m`, `s`, `U`.
fn not_in_re2(pattern: &str) -> Option<String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut class_depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\\' {
            match next {
                Some('<') | Some('>') => {
                    return Some(format!("the assertion \\{}", next.unwrap_or(' ')));
                }
                Some('b') | Some('B') if chars.get(i + 2) == Some(&'{') => {
                    return Some("a \\b{...} assertion".to_owned());
                }
                _ => {}
            }
            i += 2;
            continue;
        }
        if class_depth > 0 {
            match c {
                '[' => {
                    // A nested class, unless it is a POSIX class like [:alpha:].
                    if next == Some(':')
                        && let Some(end) = find(&chars, i + 2, ":]")
                    {
                        i = end + 2;
                        continue;
                    }
                    // RE2 has no nested classes.
                    return Some("a nested character class".to_owned());
                }
                ']' => class_depth -= 1,
                '&' | '-' | '~' if next == Some(c) => {
                    return Some(format!("the class set operation {c}{c}"));
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        match c {
            '[' => {
                class_depth = 1;
                i += 1;
                // `[]...]` and `[^]...]`: a leading `]` is a literal.
                if chars.get(i) == Some(&'^') {
                    i += 1;
                }
                if chars.get(i) == Some(&']') {
                    i += 1;
                }
                continue;
            }
            '{' => {
                // RE2 repeats at most 1000 times: `a{1001}` is refused.
                if let Some(end) = find(&chars, i + 1, "}") {
                    let counts: String = chars[i + 1..end].iter().collect();
                    let bounds: Vec<&str> = counts.split(',').collect();
                    let numeric = bounds.len() <= 2
                        && bounds[0].chars().all(|d| d.is_ascii_digit())
                        && !bounds[0].is_empty();
                    if numeric
                        && bounds
                            .iter()
                            .filter_map(|b| b.parse::<u64>().ok())
                            .any(|n| n > 1000)
                    {
                        return Some(format!("the repetition {{{counts}}} (RE2 allows 1000)"));
                    }
                }
            }
            '(' if next == Some('?') => {
                let mut j = i + 2;
                while let Some(&f) = chars.get(j) {
                    match f {
                        'i' | 'm' | 's' | 'U' | '-' => j += 1,
                        ':' | ')' => break,
                        'P' | '<' if j == i + 2 => break, // named group
                        other => return Some(format!("the flag or group syntax (?{other}")),
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn find(chars: &[char], from: usize, needle: &str) -> Option<usize> {
    let needle: Vec<char> = needle.chars().collect();
    (from..chars.len()).find(|&k| chars[k..].starts_with(&needle))
}

/// A virtual-host domain (already lower-cased). Envoy rejects control characters; for a
/// TLS host, which also becomes an SNI `server_names` entry, Envoy accepts no wildcard but
/// a leading `*.` ("partial wildcards are not supported").
pub fn host(host: &str, tls: bool) -> Result<(), String> {
    if host.is_empty() {
        return Err("a host name is empty".to_owned());
    }
    header_value(host).map_err(|e| format!("host {e}"))?;
    if host.ends_with("switchyard.invalid") {
        return Err(format!("host {host:?} is reserved for Switchyard's probes"));
    }
    if tls && host.contains('*') {
        let ok = host
            .strip_prefix("*.")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('*'));
        if !ok {
            return Err(format!(
                "host {host:?} cannot be used with TLS: the only wildcard SNI supports is a leading \"*.\""
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regexes() {
        assert!(regex("^/api/v[0-9]+/users/[a-z0-9-]+$").is_ok());
        assert!(regex("/(?P<id>[0-9]+)").is_ok());
        assert!(regex("(?i)/Foo[[:alpha:]]+").is_ok());
        assert!(regex("[]a]").is_ok());
        assert!(regex("[^]a]").is_ok());
        assert!(regex("a--b").is_ok());
        assert!(regex(r"\[a&&b\]").is_ok());

        let e = regex("/api/(unclosed").unwrap_err();
        assert!(e.contains("does not compile"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert_eq!(regex("").unwrap_err(), "regex is empty");
        assert!(regex(r"\bfoo\>").unwrap_err().contains("RE2"));
        assert!(regex(r"\b{start}foo").unwrap_err().contains("RE2"));
        assert!(regex("[a-z&&[^x]]").unwrap_err().contains("RE2"));
        assert!(regex("[a-z--x]").unwrap_err().contains("RE2"));
        assert!(regex("(?x) a b").unwrap_err().contains("RE2"));
        assert!(regex("(?u)a").unwrap_err().contains("RE2"));
        assert!(regex("(?R)a").unwrap_err().contains("RE2"));
        assert!(regex("/a{1000}").is_ok());
        assert!(regex("/a{1001}").unwrap_err().contains("RE2 allows 1000"));
        assert!(regex("/a{2,1001}").unwrap_err().contains("RE2"));
        assert!(regex("[{]1001}").is_ok(), "a brace in a class is a literal");
        // Lookaround and backreferences are rejected by both.
        assert!(regex("(?=a)").is_err());
        assert!(regex(r"(a)\1").is_err());
    }

    #[test]
    fn headers() {
        assert!(header_name("x-user").is_ok());
        assert!(header_name(":path").is_ok());
        assert!(header_name("x_y.z~1").is_ok());
        assert!(header_name("bad header").unwrap_err().contains("token"));
        assert!(header_name("x:y").is_err());
        assert!(header_name(":").is_err());
        assert!(header_value(&"v".repeat(MAX_HEADER_BYTES)).is_ok());
        assert!(header_value(&"v".repeat(MAX_HEADER_BYTES + 1)).is_err());
        assert!(header_name("").is_err());
        assert!(header_name("x\r\ny").is_err());
        assert!(header_value("ok value").is_ok());
        assert!(header_value("bad\nvalue").is_err());
        assert!(modifiable_header("x-forwarded-for").is_ok());
        assert!(modifiable_header(":path").is_err());
        assert!(modifiable_header("Host").is_err());
    }

    #[test]
    fn hosts() {
        assert!(host("example.com", true).is_ok());
        assert!(host("*.example.com", true).is_ok());
        assert!(host("*", false).is_ok());
        assert!(host("api.*", false).is_ok());
        assert!(host("*", true).is_err());
        assert!(host("api.*", true).is_err());
        assert!(host("*.*.example.com", true).is_err());
        assert!(host("a*.example.com", true).is_err());
        assert!(host("", false).is_err());
        assert!(host("a\nb", false).is_err());
        assert!(host("x.probe.switchyard.invalid", false).is_err());
        assert!(host("*.switchyard.invalid", false).is_err());
        assert!(host("*.invalid", false).is_ok());
    }
}
