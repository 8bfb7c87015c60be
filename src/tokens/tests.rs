//! Tokens round-trip, refuse forgeries and never read as another purpose's.

use super::*;

fn signer() -> Signer {
    Signer::new(&[7u8; 32])
}

#[test]
fn unsubscribe_tokens_round_trip_and_refuse_forgeries() {
    let s = signer();
    for (c, r) in [(1, 1), (3, 1_000_000), (i64::from(u32::MAX), 1 << 40)] {
        let t = s.unsubscribe_token(c, r);
        assert!(t.len() <= 32, "{t}");
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(s.read_unsubscribe(&t), Some((c, r)));
        // Truncated, altered, or under another secret: nothing.
        assert_eq!(s.read_unsubscribe(&t[..t.len() - 1]), None);
        let mut bytes = t.clone().into_bytes();
        bytes[0] = if bytes[0] == b'A' { b'B' } else { b'A' };
        assert_eq!(s.read_unsubscribe(&String::from_utf8(bytes).unwrap()), None);
        assert_eq!(Signer::new(&[8u8; 32]).read_unsubscribe(&t), None);
        // A token of one purpose is no token of another.
        assert_eq!(s.read_verp(&s.verp_token(c, r)), Some((c, r)));
        assert_eq!(s.read_unsubscribe(&s.verp_token(c, r)), None);
    }
    // A campaign of a million recipients: 22 characters.
    assert_eq!(s.unsubscribe_token(3, 1_000_000).len(), 22);
    assert_eq!(s.read_unsubscribe(""), None);
    assert_eq!(s.read_unsubscribe("not a token!"), None);
}

#[test]
fn verp_tokens_are_lower_case_and_case_blind() {
    let s = signer();
    let t = s.verp_token(12, 345_678);
    assert_eq!(t, t.to_ascii_lowercase());
    assert!(format!("bounces+{t}").len() <= 64);
    assert_eq!(s.read_verp(&t.to_ascii_uppercase()), Some((12, 345_678)));
}

#[test]
fn message_verp_tokens_never_read_as_a_campaign_s() {
    let s = signer();
    let t = s.message_verp_token(9_000_001);
    assert_eq!(
        s.read_message_verp(&t.to_ascii_uppercase()),
        Some(9_000_001)
    );
    assert!(format!("bounces+{t}").len() <= 64);
    // Campaign 9000001's recipient 1 has another token, and neither
    // reads as the other.
    assert_eq!(s.read_verp(&t), None);
    assert_eq!(s.read_message_verp(&s.verp_token(9_000_001, 1)), None);
    assert_eq!(Signer::new(&[8u8; 32]).read_message_verp(&t), None);
}

#[test]
fn message_id_tokens_are_their_own_purpose() {
    let s = signer();
    let t = s.message_id_token(7, 42);
    assert_eq!(s.read_message_id_token(&t), Some((7, 42)));
    assert_eq!(s.read_verp(&t), None);
    assert_eq!(s.read_message_id_token(&s.verp_token(7, 42)), None);
    assert_eq!(Signer::new(&[8u8; 32]).read_message_id_token(&t), None);
    assert_eq!(s.read_message_id_token("aaaaaaaaaaaaaaaaaaaaaaaaaa"), None);
}

#[test]
fn job_macs_cover_database_campaign_and_every_recipient() {
    let s = signer();
    let mac = s.job_mac("db-1", 5, &[1, 2, 3]);
    assert!(s.verify_job("db-1", 5, &[1, 2, 3], &mac));
    assert!(!s.verify_job("db-2", 5, &[1, 2, 3], &mac));
    assert!(!s.verify_job("db-1", 6, &[1, 2, 3], &mac));
    assert!(!s.verify_job("db-1", 5, &[1, 2, 4], &mac));
    assert!(!s.verify_job("db-1", 5, &[1, 2, 3], ""));
    assert!(!s.verify_job("db-1", 5, &[1, 2, 3], &mac[..10]));
}

#[test]
fn click_tokens_cover_their_link_number() {
    let s = signer();
    let m = Tracked {
        campaign: 3,
        recipient: 1_000_000,
        version: 2,
    };
    let open = s.open_token(m);
    assert_eq!(s.read_open(&open), Some(m));
    assert_eq!(s.read_open(&open[..open.len() - 1]), None);
    assert_eq!(s.read_click(&open, 1), None);
    let click = s.click_token(m, 4);
    assert_eq!(s.read_click(&click, 4), Some(m));
    assert_eq!(s.read_click(&click, 5), None);
    assert_eq!(s.read_click(&click, 0), None);
    assert_eq!(s.read_open(&click), None);
    assert_eq!(Signer::new(&[8u8; 32]).read_click(&click, 4), None);
    assert_eq!(s.read_unsubscribe(&open), None);
    assert!(click.len() <= 32, "{click}");
}

#[test]
fn varints_have_one_spelling() {
    let mut out = Vec::new();
    put_varint(&mut out, 300);
    let mut input = &out[..];
    assert_eq!(take_varint(&mut input), Some(300));
    let mut padded: &[u8] = &[0x80, 0x00];
    assert_eq!(take_varint(&mut padded), None);
}

#[test]
fn message_tokens_name_the_message_under_purposes_of_their_own() {
    let s = signer();
    let open = s.message_open_token(42);
    assert_eq!(s.read_message_open(&open), Some(42));
    assert_eq!(s.read_message_open(&open[..open.len() - 1]), None);
    assert_eq!(Signer::new(&[8u8; 32]).read_message_open(&open), None);
    // Never read as a campaign's, nor as another page's.
    assert_eq!(s.read_open(&open), None);
    assert_eq!(s.read_message_view(&open), None);
    assert_eq!(s.read_message_preferences(&open), None);
    let campaign_open = s.open_token(Tracked {
        campaign: 42,
        recipient: 1,
        version: 1,
    });
    assert_eq!(s.read_message_open(&campaign_open), None);
    let prefs = s.message_preferences_token(42, 7);
    assert_eq!(s.read_message_preferences(&prefs), Some((42, 7)));
    assert_eq!(s.read_preferences(&prefs), None);
    let view = s.message_view_token(42);
    assert_eq!(s.read_message_view(&view), Some(42));
    assert_eq!(s.read_view(&view), None);
    // A link token binds the message and the exact URL.
    let link = s.message_mail_links(42).token("https://shop.test/a");
    assert_eq!(s.read_message_link(&link, "https://shop.test/a"), Some(42));
    assert_eq!(s.read_message_link(&link, "https://evil.test/"), None);
    let campaign_link = s
        .message_links(Tracked {
            campaign: 42,
            recipient: 1,
            version: 1,
        })
        .token("https://shop.test/a");
    assert_eq!(
        s.read_message_link(&campaign_link, "https://shop.test/a"),
        None
    );
    assert_eq!(s.read_link(&link, "https://shop.test/a"), None);
}
