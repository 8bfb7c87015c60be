//! A message job's batch statements against both databases: the claim,
//! the `sending` marks and the outcomes, each one statement for the batch.
//! The outcomes' UPDATE carries a status, a reply and a send time per row:
//! each row must get its own, and only where this claim still holds it.

use mailsplit::store::messages::{self, batch, Claim, Inserted, MessageStatus, NewMessage};
use mailsplit::store::{now_ms, Conn};

use crate::util::*;

both!(a_batch_records_each_outcome_of_its_own_where_the_claim_holds);

/// Message number `i`, queued.
fn queued(conn: &mut Conn, i: usize) -> i64 {
    let (to, key) = (format!("m{i}@example.test"), format!("k{i}"));
    let new = NewMessage {
        template_id: 1,
        template_name: "t",
        to_addr: &to,
        data: "{}",
        idempotency_key: Some(&key),
        body_hash: "h",
        status: MessageStatus::Queued,
        reply: None,
        now: now_ms(),
    };
    match messages::insert(conn, &new).expect("insert") {
        Inserted::New(m) => m.id,
        other => panic!("a new message, not {other:?}"),
    }
}

fn a_batch_records_each_outcome_of_its_own_where_the_claim_holds(kind: Kind) {
    let db = TestDb::new(kind);
    let mut conn = Conn::open(&db.url).expect("open");
    conn.migrate().expect("migrate");
    let ids: Vec<i64> = (0..5).map(|i| queued(&mut conn, i)).collect();
    let (mine, theirs, now) = (11, 22, now_ms());
    // Message 3 is another worker's; the rest are this one's.
    let other = batch::claim(&mut conn, &ids[3..4], theirs, 60_000, now).expect("claim");
    assert!(matches!(other[0], Claim::Mine(_)));
    let claims = batch::claim(&mut conn, &ids, mine, 60_000, now).expect("claim");
    let got: Vec<bool> = claims.iter().map(|c| matches!(c, Claim::Mine(_))).collect();
    assert_eq!(got, [true, true, true, false, true]);
    let sending = batch::start_sending(&mut conn, &ids[..2], mine).expect("sending");
    assert_eq!(sending, [true, true]);

    let outcomes = vec![
        (ids[0], MessageStatus::Sent, None),
        (
            ids[1],
            MessageStatus::Failed,
            Some("550 no such user".to_string()),
        ),
        (
            ids[2],
            MessageStatus::Queued,
            Some("451 try later".to_string()),
        ),
        (ids[3], MessageStatus::Sent, None),
    ];
    let ours = batch::record(&mut conn, &outcomes, mine, now + 5).expect("record");
    assert_eq!(ours, [true, true, true, false]);
    let row = |conn: &mut Conn, id: i64| messages::find(conn, id).expect("find").expect("row");
    let sent = row(&mut conn, ids[0]);
    assert_eq!(
        (sent.status, sent.reply, sent.sent_at),
        (MessageStatus::Sent, None, Some(now + 5))
    );
    let failed = row(&mut conn, ids[1]);
    assert_eq!(
        (failed.status, failed.reply.as_deref(), failed.sent_at),
        (MessageStatus::Failed, Some("550 no such user"), None)
    );
    let again = row(&mut conn, ids[2]);
    assert_eq!(
        (again.status, again.reply.as_deref(), again.sent_at),
        (MessageStatus::Queued, Some("451 try later"), None)
    );
    // Another worker's claim is left as it was.
    let held = row(&mut conn, ids[3]);
    assert_eq!(
        (held.status, held.claim_token),
        (MessageStatus::Claimed, Some(theirs))
    );

    // One message twice in a batch: in order, the second finding the
    // first's status (put back), as one statement per outcome did.
    let twice = vec![
        (ids[4], MessageStatus::Queued, None),
        (ids[4], MessageStatus::Sent, None),
    ];
    let ours = batch::record(&mut conn, &twice, mine, now + 6).expect("record");
    assert_eq!(ours, [true, false]);
    assert_eq!(row(&mut conn, ids[4]).status, MessageStatus::Queued);
}
