//! Which migrations a database has, against the ones this binary embeds:
//! a schema older than the binary names `mailsplit migrate` as the fix
//! ([`Conn::check_migrated`]); one a newer binary migrated is refused as
//! each connection opens ([`Conn::refuse_newer_schema`]), so no command
//! runs on a schema it does not know.

use diesel::QueryableByName;

use super::{migrations_of, on, Backend, Conn, Result, StoreError};

impl Conn {
    /// The versions of the migrations applied to this database (none when
    /// it has no migrations table yet). Writes nothing: diesel's own
    /// harness would create its table.
    fn applied_migrations(&mut self) -> Result<Option<Vec<String>>> {
        use diesel::sql_types::Text;
        use diesel::RunQueryDsl;
        #[derive(QueryableByName)]
        struct Applied {
            #[diesel(sql_type = Text)]
            version: String,
        }
        let query = "SELECT version FROM __diesel_schema_migrations";
        match on!(self, |c| diesel::sql_query(query).load::<Applied>(c)) {
            Ok(rows) => Ok(Some(rows.into_iter().map(|r| r.version).collect())),
            Err(diesel::result::Error::DatabaseError(_, info))
                if info.message().contains("no such table")
                    || info.message().contains("does not exist") =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The versions of this binary's migrations.
    fn known_migrations() -> Result<Vec<String>> {
        let known = diesel::migration::MigrationSource::<diesel::sqlite::Sqlite>::migrations(
            &migrations_of(Backend::Sqlite),
        )
        .map_err(|e| StoreError::Migrate(e.to_string()))?;
        Ok(known
            .iter()
            .map(|m| m.name().version().to_string())
            .collect())
    }

    /// Refuse a database a newer mailsplit migrated ([`StoreError::NewerSchema`]):
    /// every connection is checked as it is opened, so no command (not even
    /// `migrate`, which would say "up to date") runs on a schema it does not
    /// know.
    pub(super) fn refuse_newer_schema(&mut self) -> Result<()> {
        let Some(applied) = self.applied_migrations()? else {
            return Ok(());
        };
        let known = Conn::known_migrations()?;
        let mut unknown: Vec<String> = applied.into_iter().filter(|v| !known.contains(v)).collect();
        if unknown.is_empty() {
            return Ok(());
        }
        unknown.sort();
        Err(StoreError::NewerSchema(unknown))
    }

    /// Fail with a message that names the fix when the schema is missing or
    /// older than this binary. Reads diesel's record of applied migrations
    /// and writes nothing (diesel's own check would create its table).
    pub fn check_migrated(&mut self) -> Result<()> {
        let Some(applied) = self.applied_migrations()? else {
            return Err(StoreError::NotMigrated("missing"));
        };
        let all_applied = Conn::known_migrations()?
            .iter()
            .all(|v| applied.contains(v));
        if all_applied {
            Ok(())
        } else {
            Err(StoreError::NotMigrated("older than this mailsplit"))
        }
    }
}
