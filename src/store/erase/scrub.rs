//! Free text that may quote a forgotten person: a relay's reply, a bounce
//! report's reason, a URL a template wrote. Each spelling of the address
//! is replaced by [`ADDRESS_MARK`] (still an address, so what masks
//! addresses in `report` masks it too) and the name by [`MARK`], ASCII
//! case ignored; the rest of the text stays, so `report` still groups by
//! it.

use diesel::prelude::*;
use diesel::sql_types::{Nullable, Text};

use super::super::{on, Backend, Conn, Result};

/// What replaces the name in a text.
pub const MARK: &str = "forgotten";
/// What replaces the address in a text.
pub const ADDRESS_MARK: &str = "forgotten@forgotten.invalid";
/// Names shorter than this are not searched for in free text: "Al" would
/// wreck every reply that says "ALL".
const MIN_NAME: usize = 3;

/// The spellings to erase, lower case (ASCII), each with its mark.
#[derive(Debug, Default, Clone)]
pub struct Needles(Vec<(String, &'static str)>);

impl Needles {
    /// An address as stored, and as a URL would carry it (`%40`).
    pub fn add_address(&mut self, address: &str) {
        let a = address.trim().to_ascii_lowercase();
        if a.is_empty() {
            return;
        }
        self.push(a.replace('@', "%40"), MARK);
        self.push(a.replace('@', "%40").replace('+', "%2b"), MARK);
        self.push(a, ADDRESS_MARK);
    }

    pub fn add_name(&mut self, name: &str) {
        let n = name.trim().to_ascii_lowercase();
        if n.chars().count() >= MIN_NAME {
            self.push(n, MARK);
        }
    }

    fn push(&mut self, s: String, mark: &'static str) {
        if !self.0.iter().any(|(n, _)| *n == s) {
            self.0.push((s, mark));
            // Longest first: an address before a name inside it.
            self.0.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        }
    }

    /// `text` with every needle replaced; `None` when none was in it.
    pub fn scrub(&self, text: &str) -> Option<String> {
        let mut out = text.to_string();
        let mut changed = false;
        for (n, mark) in &self.0 {
            let mut from = 0;
            while let Some(at) = out.to_ascii_lowercase()[from..].find(n.as_str()) {
                let at = from + at;
                out.replace_range(at..at + n.len(), mark);
                from = at + mark.len();
                changed = true;
            }
        }
        changed.then_some(out)
    }

    /// `lower(column) LIKE …` patterns that find candidate rows: any row
    /// whose text holds a needle matches one of them.
    pub fn patterns(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(n, _)| format!("%{}%", n.replace(['%', '_', '\\'], "_")))
            .collect()
    }
}

#[derive(QueryableByName)]
struct Found {
    #[diesel(sql_type = Text)]
    k: String,
    #[diesel(sql_type = Nullable<Text>)]
    t: Option<String>,
}

/// Small tables whose free text may quote anybody: (table, key column,
/// text column). Each is read whole (a few hundred rows at most).
const TEXTS: &[(&str, &str, &str)] = &[
    ("unverified_reports", "id", "sample"),
    ("unverified_reports", "id", "why"),
    ("campaigns", "id", "pause_reason"),
    ("rate_groups", "name", "adapted_reason"),
    ("webhooks", "id", "last_error"),
];

/// Scrub the small tables' texts; how many texts changed.
pub fn small_tables(conn: &mut Conn, needles: &Needles) -> Result<u64> {
    let mut changed = 0;
    for (table, key, column) in TEXTS {
        let read = format!(
            "SELECT CAST({key} AS TEXT) AS k, {column} AS t FROM {table} WHERE {column} IS NOT NULL"
        );
        let rows: Vec<Found> = on!(conn, |c| diesel::sql_query(&read).load(c))?;
        for row in rows {
            let Some(text) = row.t.as_deref().and_then(|t| needles.scrub(t)) else {
                continue;
            };
            let write = match conn.backend() {
                Backend::Postgres => {
                    format!("UPDATE {table} SET {column} = $1 WHERE CAST({key} AS TEXT) = $2")
                }
                Backend::Sqlite => {
                    format!("UPDATE {table} SET {column} = ? WHERE CAST({key} AS TEXT) = ?")
                }
            };
            on!(conn, |c| diesel::sql_query(&write)
                .bind::<Text, _>(&text)
                .bind::<Text, _>(&row.k)
                .execute(c))?;
            changed += 1;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_goes_and_the_rest_stays() {
        let mut n = Needles::default();
        n.add_address("Ada.Lovelace+news@Example.org");
        n.add_name("Ada Lovelace");
        let reply = "550 5.1.1 <ADA.LOVELACE+NEWS@example.ORG>: user unknown (Ada Lovelace)";
        assert_eq!(
            n.scrub(reply).as_deref(),
            Some("550 5.1.1 <forgotten@forgotten.invalid>: user unknown (forgotten)")
        );
        let url = "https://shop.example/p?e=ada.lovelace%2Bnews%40example.org&x=1";
        assert_eq!(
            n.scrub(url).as_deref(),
            Some("https://shop.example/p?e=forgotten&x=1")
        );
        assert_eq!(n.scrub("250 ok"), None);
    }

    #[test]
    fn short_names_are_left_alone() {
        let mut n = Needles::default();
        n.add_name("Al");
        assert_eq!(n.scrub("ALL good"), None);
    }
}
