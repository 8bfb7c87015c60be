//! PostgreSQL statements written in SQL that a connection prepares once and
//! then only executes.
//!
//! diesel caches a prepared statement per connection for a query whose SQL
//! text is the same every time, but never for `sql_query` (it cannot know
//! that the text does not change) nor for a multi-row INSERT or an UPDATE.
//! Those are parsed and planned by the server on every call; for the
//! worker's two statements per job (the claim and the batch of successes),
//! that was the biggest share of PostgreSQL's CPU. A [`Prepared`] statement
//! is cached under its SQL text: write the text so it never changes (every
//! value bound, none formatted in) and it is parsed once per connection.

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::Error;
use diesel::sql_types::{Array, BigInt, Untyped};
use diesel::{PgConnection, QueryResult, RunQueryDsl};

/// One bound value.
pub(crate) enum Bind<'a> {
    Int(i64),
    Ints(&'a [i64]),
    Text(&'a str),
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
        let mut parts = self.sql.split('?');
        out.push_sql(parts.next().unwrap_or_default());
        let mut binds = self.binds.iter();
        for part in parts {
            match binds.next() {
                Some(Bind::Int(v)) => out.push_bind_param::<BigInt, _>(v)?,
                Some(Bind::Ints(v)) => out.push_bind_param::<Array<BigInt>, _>(*v)?,
                Some(Bind::Text(v)) => out.push_bind_param::<diesel::sql_types::Text, _>(*v)?,
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
    fn a_miscounted_statement_is_an_error_not_a_wrong_query() {
        let short = Prepared::new("SELECT ?, ?", vec![Bind::Int(1)]);
        assert!(sql_of(&short).is_err());
        let long = Prepared::new("SELECT ?", vec![Bind::Int(1), Bind::Int(2)]);
        assert!(sql_of(&long).is_err());
    }
}
