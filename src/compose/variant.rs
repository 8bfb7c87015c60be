//! An A/B test's variants B, C, …: the campaign's messages with another
//! subject (`campaign create --variant-subject`) and/or HTML of the
//! variant's own (`--variant-html`). A variant without HTML of its own is
//! compiled from variant A's stored content version, so body, links and
//! tracking are A's; one with its own is compiled from its own content
//! version, whose number its tracking tokens carry, so its clicks find
//! its own link table. Either way the message counts as composed with A's
//! version (`content_version`): a `campaign edit` of A outdates every
//! variant's unsent messages alike.

use std::sync::Arc;

use super::{tracking, CampaignMail, ComposeError};
use crate::store::ab::Variant;
use crate::store::content::{self as stored, Content};
use crate::store::{views, Campaign, Conn};

impl CampaignMail {
    /// This campaign's messages as variant `v` (self being variant A's);
    /// `None` when the content changed while it was read, or is missing.
    pub fn variant(
        &self,
        conn: &mut Conn,
        c: &Campaign,
        v: &Variant,
    ) -> Result<Option<CampaignMail>, ComposeError> {
        let subject = v.subject.as_deref().unwrap_or(&self.subject);
        let content = match v.content_version {
            Some(version) => views::version(conn, c.id, version)?,
            None => stored::latest(conn, c.id)?.filter(|s| s.version == self.content_version),
        };
        match content {
            Some(s) => self.compiled_as(conn, c, s, subject).map(Some),
            None => Ok(None),
        }
    }

    /// Content `s` compiled with `subject`, as these messages.
    fn compiled_as(
        &self,
        conn: &mut Conn,
        c: &Campaign,
        mut s: Content,
        subject: &str,
    ) -> Result<CampaignMail, ComposeError> {
        let links = tracking::stored_links(conn, c, &s)?;
        s.subject = subject.to_string();
        let mut compiled = tracking::compile_stored(&s, c, links)?;
        if let Some(max) = self.content.as_ref().map(|m| m.max_message()) {
            compiled.set_max_message(max);
        }
        Ok(CampaignMail {
            subject: subject.to_string(),
            content: Some(Arc::new(compiled)),
            head: std::sync::OnceLock::new(),
            ..self.clone()
        })
    }
}
