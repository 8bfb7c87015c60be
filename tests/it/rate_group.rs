//! Rate group names are parsed in one place: a domain group is stored as
//! the domain its recipients' mail is matched by (lower case, IDNA
//! A-labels), whatever spelling the operator typed.

use crate::util::*;

#[test]
fn an_internationalised_domain_group_is_stored_as_its_a_label() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let said = env.ok(&["rate", "set", "domain:Bücher.DE", "10/s"]);
    assert!(
        said.contains("rate group domain:xn--bcher-kva.de:"),
        "{said}"
    );
    let listed = env.ok(&["rate", "list"]);
    assert!(listed.contains("domain:xn--bcher-kva.de"), "{listed}");
    // The same group, however it is spelled.
    env.ok(&["rate", "delete", "domain:bücher.de"]);
    let listed = env.ok(&["rate", "list"]);
    assert!(listed.contains("no rate groups"), "{listed}");
    // Still refused: what is no domain.
    let out = env.run(&["rate", "set", "domain:a b", "10/s"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
