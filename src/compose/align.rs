//! Whether a campaign's return path (the envelope sender, which SPF
//! checks) is on the From domain's organisation, as DMARC's relaxed SPF
//! alignment wants. Without a public suffix list the organisational domain
//! is guessed: the last two labels, or three under a two-letter country
//! code with a short second level (`example.co.uk`).

/// The warning `campaign create` prints when the return path's domain is
/// not aligned with the From domain; `None` when it is (or there is none).
pub fn warning(from_domain: &str, return_path: Option<&str>) -> Option<String> {
    let rp = return_path?.rsplit_once('@')?.1.trim_end_matches('.');
    let from = from_domain.trim_end_matches('.');
    let rp = rp.to_ascii_lowercase();
    let from = from.to_ascii_lowercase();
    if organisation(&rp) == organisation(&from) {
        return None;
    }
    Some(format!(
        "the return path's domain {rp} is not {from} nor under its organisational domain: \
         SPF will pass (if at all) for {rp}, which does not align with From for DMARC, so \
         DMARC rests on the DKIM signature alone; use a return path under {from} \
         (e.g. bounces@bounce.{from})"
    ))
}

/// The guessed organisational domain (see the module doc).
pub fn organisation(domain: &str) -> String {
    let labels: Vec<&str> = domain.split('.').filter(|l| !l.is_empty()).collect();
    let n = labels.len();
    let keep = if n >= 3 && labels[n - 1].len() == 2 && labels[n - 2].len() <= 3 {
        3
    } else {
        2
    };
    labels[n.saturating_sub(keep)..].join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_not() {
        let w = |from: &str, rp: &str| warning(from, Some(rp)).is_some();
        assert!(!w("example.com", "bounces@example.com"));
        assert!(!w("example.com", "bounces@bounce.Example.com"));
        assert!(!w("news.example.com", "b@bounce.example.com"));
        assert!(!w("shop.example.co.uk", "b@bounce.example.co.uk"));
        assert!(w("example.com", "bounces@example.net"));
        assert!(w("example.co.uk", "b@other.co.uk"));
        assert!(w("example.com", "b@example.com.evil.test"));
        assert_eq!(warning("example.com", None), None);
    }
}
