//! PostgreSQL's side of an import batch: find the batch's recipients and
//! memberships, upsert the rows in one statement, mark the members.

use super::*;

/// A row of [`find_pg`].
#[derive(QueryableByName)]
struct FoundPg {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    email_key: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    attributes: String,
    #[diesel(sql_type = Text)]
    status: RecipientStatus,
    #[diesel(sql_type = Nullable<Text>)]
    status_reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    status_at: Option<i64>,
    #[diesel(sql_type = Bool)]
    member: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    import_gen: Option<i64>,
}

/// [`FoundMarks`] on PostgreSQL, in one statement, the recipients locked
/// (an unsubscribe arriving meanwhile waits for this batch and is never
/// overwritten; SQLite's write lock is the transaction's already).
///
/// Each key is looked up on its own (`LATERAL`), which can only be an
/// index probe of `recipients_mailbox`: an import into an empty database
/// grows `recipients` from nothing, and with no statistics yet (autovacuum
/// may be off, and is slow anyway) PostgreSQL planned `email_key = ANY(…)`,
/// and a join with the keys, as a scan of the whole table, every batch: the
/// import grew quadratic (BENCHMARKS.md, "Import into PostgreSQL").
pub(super) fn find_pg(c: &mut diesel::PgConnection, run: Run, keys: &[&str]) -> Result<FoundMarks> {
    // In key order: two imports of different lists that share recipients
    // lock them in the same order, and so never deadlock.
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    let rows: Vec<FoundPg> = diesel::sql_query(
        "SELECT r.id, r.email_key, r.name, r.attributes, r.status, r.status_reason, \
           r.status_at, m.recipient_id IS NOT NULL AS member, m.import_gen \
         FROM unnest($1::text[]) AS k(key) \
         CROSS JOIN LATERAL (SELECT id, email_key, name, attributes, status, status_reason, \
             status_at FROM recipients WHERE email_key = k.key FOR UPDATE) r \
         LEFT JOIN LATERAL (SELECT recipient_id, import_gen FROM list_members \
             WHERE list_id = $2 AND recipient_id = r.id) m ON true",
    )
    .bind::<Array<Text>, _>(&keys)
    .bind::<BigInt, _>(run.list_id)
    .load(c)?;
    let mut found = HashMap::with_capacity(rows.len());
    let mut marks = HashMap::with_capacity(rows.len());
    for f in rows {
        if f.member {
            marks.insert(f.id, f.import_gen);
        }
        let key = f.email_key.clone();
        let row = (
            f.id,
            Some(f.email_key),
            f.name,
            f.attributes,
            f.status,
            f.status_reason,
            f.status_at,
        );
        found.insert(key, row);
    }
    Ok((found, marks))
}

/// A row [`upsert_pg`] wrote.
#[derive(QueryableByName)]
struct Upserted {
    #[diesel(sql_type = Text)]
    email_key: String,
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// [`upsert_sqlite`] on PostgreSQL: one statement of nine arrays
/// (`unnest`: the eight columns and each new recipient's id, see
/// [`Row::new_id`]), the same text whatever the batch, instead of nine
/// parameters a row. Returns each row's key and recipient id.
pub(super) fn upsert_pg(
    c: &mut diesel::PgConnection,
    rows: &[Write],
    new_ids: &[Option<i64>],
) -> Result<Vec<(String, i64)>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let column = |f: fn(&Write) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let written = diesel::sql_query(
        "INSERT INTO recipients (id, email, email_key, name, attributes, status, \
           status_reason, status_at, updated_at) \
         SELECT COALESCE(u.id, nextval(pg_get_serial_sequence('recipients', 'id'))), \
           u.email, u.email_key, u.name, u.attributes, u.status, u.status_reason, \
           u.status_at, u.updated_at \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
           $6::text[], $7::bigint[], $8::bigint[], $9::bigint[]) \
           AS u(email, email_key, name, attributes, status, status_reason, status_at, \
             updated_at, id) \
         ON CONFLICT (email_key) DO UPDATE SET name = excluded.name, \
           attributes = excluded.attributes, status = excluded.status, \
           status_reason = excluded.status_reason, status_at = excluded.status_at, \
           updated_at = excluded.updated_at \
         RETURNING email_key, id",
    )
    .bind::<Array<Text>, _>(column(|w| w.email.clone()))
    .bind::<Array<Text>, _>(column(|w| w.email_key.clone()))
    .bind::<Array<Text>, _>(column(|w| w.name.clone()))
    .bind::<Array<Text>, _>(column(|w| w.attributes.clone()))
    .bind::<Array<Text>, _>(column(|w| w.status.as_str().to_string()))
    .bind::<Array<Nullable<Text>>, _>(
        rows.iter()
            .map(|w| w.status_reason.clone())
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Nullable<BigInt>>, _>(rows.iter().map(|w| w.status_at).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(rows.iter().map(|w| w.updated_at).collect::<Vec<_>>())
    .bind::<Array<Nullable<BigInt>>, _>(new_ids)
    .load::<Upserted>(c)?;
    Ok(written.into_iter().map(|u| (u.email_key, u.id)).collect())
}

/// [`mark_members_sqlite`] on PostgreSQL, by recipient id (no second
/// lookup of the keys), one array.
pub(super) fn mark_members_pg(c: &mut diesel::PgConnection, run: Run, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    diesel::sql_query(
        "INSERT INTO list_members (list_id, recipient_id, import_gen) \
         SELECT $1, id, $2 FROM unnest($3::bigint[]) AS k(id) \
         ON CONFLICT (list_id, recipient_id) DO UPDATE SET import_gen = excluded.import_gen",
    )
    .bind::<BigInt, _>(run.list_id)
    .bind::<BigInt, _>(run.generation)
    .bind::<Array<BigInt>, _>(ids)
    .execute(c)?;
    Ok(())
}
