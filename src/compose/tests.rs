//! Unit tests of the compose stage.

use super::mime::display_name;
use super::*;

#[test]
fn header_injection_stays_in_its_header() {
    let from = parse_from("Shop <news@example.test>").unwrap();
    let parts = || Rendered {
        html: "<p>hi</p>".into(),
        text: "hi".into(),
    };
    let msg = mime(
        &from,
        "Hi",
        "<1.2@mailsplit>".into(),
        "x\r\nBcc: victim@evil.test",
        "ada@example.test",
        parts(),
        Vec::new(),
    )
    .unwrap();
    let text = String::from_utf8(msg.bytes).unwrap();
    assert!(!text.contains("\r\nBcc:"), "{text}");
    assert_eq!(msg.envelope.to().len(), 1);
    assert!(mime(
        &from,
        "s",
        "<x@y>".into(),
        "",
        "not an address",
        parts(),
        Vec::new()
    )
    .is_err());
    assert!(parse_from("bad\r\nBcc: x@y").is_err());
}

#[test]
fn return_paths_and_verp_senders() {
    assert_eq!(
        parse_return_path("bounces@Bounce.Example.test").unwrap(),
        "bounces@bounce.example.test"
    );
    for bad in [
        "bounces+x@b.test",
        "no-at",
        &format!("{}@b.test", "x".repeat(33)),
    ] {
        assert!(parse_return_path(bad).is_err(), "{bad}");
    }
    let identity = Identity {
        database_id: "db-0123456789abcdef".into(),
        signer: crate::tokens::Signer::new(&[3u8; 32]),
    };
    let from = parse_from("Shop <news@example.test>").unwrap();
    let mut campaign = CampaignMail {
        id: 2_000_000,
        name: "c".into(),
        template: "newsletter".into(),
        subject: "s".into(),
        domain: from_domain(&from),
        from,
        list_id: 1,
        list_name: "l".into(),
        public_url: None,
        identity: identity.clone(),
        dkim: Vec::new().into(),
        verp: None,
        content: None,
        content_version: 0,
        head: Default::default(),
        mailto: Default::default(),
    };
    assert_eq!(
        envelope_sender(&campaign, 5).to_string(),
        "news@example.test"
    );
    campaign.verp = Some(Verp::parse(&format!("{}@Bounce.example.test", "x".repeat(32))).unwrap());
    // The largest ids the limit is made for still fit in 64 octets.
    let sender = envelope_sender(&campaign, (1 << 35) - 1);
    assert!(sender.user().len() <= 64, "{sender}");
    assert_eq!(sender.domain(), "bounce.example.test");
    let token = sender.user().split_once('+').unwrap().1;
    assert_eq!(token, token.to_ascii_lowercase());
    assert_eq!(
        identity.signer.read_verp(token),
        Some((2_000_000, (1 << 35) - 1))
    );
    // Message-IDs: ours (this database) only.
    let id = message_id_of(&identity, 3, 77, "example.test");
    assert!(id.contains(&identity.database_id), "{id}");
    assert_eq!(read_message_id(&id, &identity), Some((3, 77)));
    let other = Identity {
        database_id: identity.database_id.clone(),
        signer: crate::tokens::Signer::new(b"another secret"),
    };
    assert_eq!(read_message_id(&id, &other), None);
    // The sequential ids of old: anybody could write one.
    let old = format!("<3.77.{}@example.test>", identity.database_id);
    assert_eq!(read_message_id(&old, &identity), None);
    assert_eq!(read_message_id("<x.77.y@example.test>", &identity), None);
}

/// RFC 5322: no line over 998 characters, whatever the name holds.
#[test]
fn long_names_keep_every_line_within_the_limit() {
    let from = parse_from("Shop <news@example.test>").unwrap();
    let names = [
        "a".repeat(2_000),
        "ü".repeat(2_000),
        "\"".repeat(2_000),
        format!("{}x", "a".repeat(30)).repeat(60),
        format!("Ada {}", "\\".repeat(1_999)),
    ];
    for name in names {
        let msg = mime(
            &from,
            "Hi",
            "<1.2@m>".into(),
            &name,
            "ada@example.test",
            Rendered {
                html: "h".into(),
                text: "t".into(),
            },
            Vec::new(),
        )
        .unwrap();
        let text = String::from_utf8(msg.bytes).unwrap();
        let longest = text.split("\r\n").map(str::len).max().unwrap();
        assert!(longest <= 998, "a {longest}-character line for {name:.20}…");
        assert!(text.contains("ada@example.test>"), "{text}");
    }
    assert_eq!(display_name(&"x".repeat(500)).len(), MAX_DISPLAY_NAME);
    assert_eq!(display_name(" Ada\r\nLovelace "), "Ada  Lovelace");
}

/// A worker reads only the attributes the templates name (and the
/// recipient's own unsubscribe link); all of them when a template uses
/// `attributes` as a whole or the body is a built-in starter.
#[test]
fn attributes_needed_are_the_ones_the_templates_name() {
    use super::content::{Compiled, Sources};
    let compile = |html: &str| {
        Compiled::new(
            &Sources {
                subject: ("--subject", "Hi {{ attributes.first }}"),
                body: Some([
                    ("a.html", html),
                    ("a.txt", "{{ attributes.city | default('x') }}"),
                ]),
            },
            "spring",
        )
        .unwrap()
    };
    let named = compile(
        "<p>{% if attributes.coupon %}{{ attributes.coupon.code }}{% endif %}{% if attributes.vip %}!{% endif %}</p>",
    );
    let want = ["city", "coupon", "first", "vip"].map(String::from);
    assert_eq!(
        named.attributes_used(),
        Some(std::collections::BTreeSet::from(want))
    );
    for whole in [
        "{% for k, v in attributes | items %}{{ k }}{% endfor %}",
        "{{ attributes[name] | default('') }}",
        "{% set a = attributes %}{{ a.city }}",
    ] {
        assert_eq!(compile(whole).attributes_used(), None, "{whole}");
    }
    let starter = Compiled::new(
        &Sources {
            subject: ("--subject", "Hi {{ attributes.first }}"),
            body: None,
        },
        "spring",
    )
    .unwrap();
    assert_eq!(starter.attributes_used(), None);
}
