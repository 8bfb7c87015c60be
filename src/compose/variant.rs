//! An A/B test's variants: the campaign's messages with another subject
//! (`campaign create --variant-subject`), compiled from the same stored
//! content version, so body, links and tracking are variant A's.

use std::sync::Arc;

use super::{tracking, CampaignMail, ComposeError};
use crate::store::content as stored;
use crate::store::{Campaign, Conn};

impl CampaignMail {
    /// This campaign's messages with `subject` (a Jinja template) instead
    /// of the stored one; `None` for a campaign without stored content.
    pub fn with_subject(
        &self,
        conn: &mut Conn,
        c: &Campaign,
        subject: &str,
    ) -> Result<Option<CampaignMail>, ComposeError> {
        let Some(mut s) = stored::latest(conn, c.id)? else {
            return Ok(None);
        };
        if s.version != self.content_version {
            // An edit between the two reads: the next load sees both.
            return Ok(None);
        }
        let links = tracking::stored_links(conn, c, &s)?;
        s.subject = subject.to_string();
        let mut compiled = tracking::compile_stored(&s, c, links)?;
        if let Some(max) = self.content.as_ref().map(|m| m.max_message()) {
            compiled.set_max_message(max);
        }
        Ok(Some(CampaignMail {
            subject: subject.to_string(),
            content: Some(Arc::new(compiled)),
            head: std::sync::OnceLock::new(),
            ..self.clone()
        }))
    }
}
