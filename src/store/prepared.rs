//! Statements written in SQL that a connection prepares once and then only
//! executes, on either backend.
//!
//! diesel caches a prepared statement per connection for a query whose SQL
//! text is the same every time, but never for `sql_query` (it cannot know
//! that the text does not change), for `eq_any` over a slice (one `?` per
//! element on SQLite), nor for a multi-row INSERT or an UPDATE. Those are
//! parsed and planned on every call: for the worker's statements per job
//! (the claim, the batch of successes, the counters) that was a tenth of a
//! worker's CPU on SQLite and the biggest share of PostgreSQL's. A
//! [`Prepared`] statement is cached under its SQL text: write the text so it
//! never changes (every value bound, none formatted in) and it is parsed
//! once per connection. A list of ids travels as one value: a PostgreSQL
//! array (`unnest(?)`, `= ANY(?)`), or on SQLite a JSON array
//! ([`Bind::Json`], read with `json_each(?)`).

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::Error;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Untyped};
use diesel::sqlite::Sqlite;
use diesel::{PgConnection, QueryResult, RunQueryDsl, SqliteConnection};

/// One bound value.
pub(crate) enum Bind<'a> {
    Int(i64),
    OptInt(Option<i64>),
    /// PostgreSQL only: an array.
    Ints(&'a [i64]),
    /// A JSON text: on SQLite, how a list of ids travels (see [`ids_json`]).
    Json(&'a str),
    Text(&'a str),
    OptText(Option<&'a str>),
}

/// `texts` as a JSON array of strings (for `json_each(?)` on SQLite, or
/// a JSON parameter on PostgreSQL), serialised from the slice, not from a
/// copy of it.
pub(crate) fn texts_json(texts: &[String]) -> String {
    serde_json::to_string(texts).expect("a list of strings always serialises")
}

/// `ids` as a JSON array, for `json_each(?)` on SQLite.
pub(crate) fn ids_json(ids: &[i64]) -> String {
    let mut out = String::with_capacity(ids.len() * 8 + 2);
    out.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&id.to_string());
    }
    out.push(']');
    out
}

/// SQL in which each `?` stands for the next of `binds`, in order.
pub(crate) struct Prepared<'a> {
    sql: &'a str,
    binds: Vec<Bind<'a>>,
}

impl<'a> Prepared<'a> {
    pub(crate) fn new(sql: &'a str, binds: Vec<Bind<'a>>) -> Self {
        Prepared { sql, binds }
    }
}

impl QueryFragment<Pg> for Prepared<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.walk(
            |bind, out: &mut AstPass<'_, 'b, Pg>| match bind {
                Bind::Int(v) => out.push_bind_param::<BigInt, _>(v),
                Bind::OptInt(v) => out.push_bind_param::<Nullable<BigInt>, _>(v),
                Bind::Ints(v) => out.push_bind_param::<Array<BigInt>, _>(*v),
                Bind::Json(v) | Bind::Text(v) => out.push_bind_param::<Text, _>(*v),
                Bind::OptText(v) => out.push_bind_param::<Nullable<Text>, _>(v),
            },
            &mut out,
        )
    }
}

impl QueryFragment<Sqlite> for Prepared<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        self.walk(
            |bind, out: &mut AstPass<'_, 'b, Sqlite>| match bind {
                Bind::Int(v) => out.push_bind_param::<BigInt, _>(v),
                Bind::OptInt(v) => out.push_bind_param::<Nullable<BigInt>, _>(v),
                Bind::Ints(_) => Err(Error::QueryBuilderError(
                    "prepared statement: an array on SQLite (bind the ids as JSON)".into(),
                )),
                Bind::Json(v) | Bind::Text(v) => out.push_bind_param::<Text, _>(*v),
                Bind::OptText(v) => out.push_bind_param::<Nullable<Text>, _>(v),
            },
            &mut out,
        )
    }
}

impl<'a> Prepared<'a> {
    /// The SQL text with each `?` replaced by the next value, pushed by
    /// `push` (the backend's bind types).
    fn walk<'b, DB: diesel::backend::Backend>(
        &'b self,
        push: impl Fn(&'b Bind<'a>, &mut AstPass<'_, 'b, DB>) -> QueryResult<()>,
        out: &mut AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        let mut parts = self.sql.split('?');
        out.push_sql(parts.next().unwrap_or_default());
        let mut binds = self.binds.iter();
        for part in parts {
            match binds.next() {
                Some(bind) => push(bind, out)?,
                None => return Err(miscount("more `?` than values")),
            }
            out.push_sql(part);
        }
        match binds.next() {
            Some(_) => Err(miscount("more values than `?`")),
            None => Ok(()),
        }
    }
}

fn miscount(what: &str) -> Error {
    Error::QueryBuilderError(format!("prepared statement: {what}").into())
}

/// No static id: diesel then keys its cache by the SQL text (and the bind
/// types), which is what makes the statement prepared once.
impl QueryId for Prepared<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// Rows are read by name (`QueryableByName`), as with `sql_query`.
impl Query for Prepared<'_> {
    type SqlType = Untyped;
}

impl RunQueryDsl<PgConnection> for Prepared<'_> {}
impl RunQueryDsl<SqliteConnection> for Prepared<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::query_builder::QueryBuilder;

    fn sql_of(p: &Prepared) -> QueryResult<String> {
        let mut qb = <Pg as diesel::backend::Backend>::QueryBuilder::default();
        p.to_sql(&mut qb, &Pg)?;
        Ok(qb.finish())
    }

    #[test]
    fn each_question_mark_becomes_the_next_placeholder() {
        let ids = [1, 2];
        let p = Prepared::new(
            "SELECT ? + 1 FROM unnest(?) WHERE x = ?",
            vec![Bind::Int(1), Bind::Ints(&ids), Bind::Int(3)],
        );
        assert_eq!(
            sql_of(&p).expect("three values for three marks"),
            "SELECT $1 + 1 FROM unnest($2) WHERE x = $3"
        );
    }

    #[test]
    fn ids_travel_to_sqlite_as_one_json_array() {
        assert_eq!(ids_json(&[]), "[]");
        assert_eq!(ids_json(&[7, -1, i64::MAX]), format!("[7,-1,{}]", i64::MAX));
        let parsed: Vec<i64> = serde_json::from_str(&ids_json(&[1, 2, 3])).expect("JSON");
        assert_eq!(parsed, [1, 2, 3]);
    }

    #[test]
    fn a_miscounted_statement_is_an_error_not_a_wrong_query() {
        let short = Prepared::new("SELECT ?, ?", vec![Bind::Int(1)]);
        assert!(sql_of(&short).is_err());
        let long = Prepared::new("SELECT ?", vec![Bind::Int(1), Bind::Int(2)]);
        assert!(sql_of(&long).is_err());
    }
}
