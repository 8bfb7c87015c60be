//! SQLite's side of an import batch: find the batch's recipients and
//! memberships, upsert the rows as one JSON array, mark the members.

use super::*;

/// [`FoundMarks`] on SQLite: two indexed reads, in process.
pub(super) fn find_sqlite(
    c: &mut diesel::SqliteConnection,
    run: Run,
    keys: &[&str],
) -> Result<FoundMarks> {
    let found: Vec<Found> = r::table
        .filter(r::email_key.eq_any(keys))
        .select((
            r::id,
            r::email_key,
            r::name,
            r::attributes,
            r::status,
            r::status_reason,
            r::status_at,
        ))
        .load(c)?;
    let ids: Vec<i64> = found.iter().map(|f| f.0).collect();
    let marks = m::table
        .filter(m::list_id.eq(run.list_id))
        .filter(m::recipient_id.eq_any(&ids))
        .select((m::recipient_id, m::import_gen))
        .load::<(i64, Option<i64>)>(c)?
        .into_iter()
        .collect();
    let found = found
        .into_iter()
        .filter_map(|f| Some((f.1.clone()?, f)))
        .collect();
    Ok((found, marks))
}

/// Insert or update the rows; an existing recipient keeps the spelling it
/// was first imported with. diesel cannot batch an upsert on SQLite, nor
/// cache one: row by row, each row's statement was parsed and planned anew
/// (two thirds of a 1M import's CPU in SQLite's parser and code
/// generator). The batch goes as one JSON array of rows instead, unpacked
/// by `json_each` in array order (so ids follow the file's order).
pub(super) fn upsert_sqlite(c: &mut diesel::SqliteConnection, rows: &[Write]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let batch: Vec<_> = rows
        .iter()
        .map(|w| {
            (
                &w.email,
                &w.email_key,
                &w.name,
                &w.attributes,
                w.status.as_str(),
                &w.status_reason,
                w.status_at,
                w.updated_at,
            )
        })
        .collect();
    let json = serde_json::to_string(&batch)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    // `json_extract`, not `->>`, which needs SQLite 3.38 (Debian 11 has
    // 3.34). `WHERE true`: SQLite's grammar needs it between an INSERT's
    // SELECT and its ON CONFLICT.
    diesel::sql_query(
        "INSERT INTO recipients (email, email_key, name, attributes, status, \
           status_reason, status_at, updated_at) \
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), \
           json_extract(value, '$[2]'), json_extract(value, '$[3]'), \
           json_extract(value, '$[4]'), json_extract(value, '$[5]'), \
           json_extract(value, '$[6]'), json_extract(value, '$[7]') \
         FROM json_each(?) WHERE true \
         ON CONFLICT (email_key) DO UPDATE SET name = excluded.name, \
           attributes = excluded.attributes, status = excluded.status, \
           status_reason = excluded.status_reason, status_at = excluded.status_at, \
           updated_at = excluded.updated_at",
    )
    .bind::<diesel::sql_types::Text, _>(json)
    .execute(c)?;
    Ok(())
}

/// Make the recipients members of the run's list, marked with its
/// generation.
pub(super) fn mark_members_sqlite(
    c: &mut diesel::SqliteConnection,
    run: Run,
    keys: &[&str],
) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    diesel::insert_into(m::table)
        .values(r::table.filter(r::email_key.eq_any(keys)).select((
            run.list_id.into_sql::<BigInt>(),
            r::id,
            Some(run.generation).into_sql::<Nullable<BigInt>>(),
        )))
        .into_columns((m::list_id, m::recipient_id, m::import_gen))
        .on_conflict((m::list_id, m::recipient_id))
        .do_update()
        .set(m::import_gen.eq(excluded(m::import_gen)))
        .execute(c)?;
    Ok(())
}
