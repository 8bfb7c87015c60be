//! One transactional message exactly as it goes on the wire: the message
//! template's stored content rendered with the message's `data` (and the
//! recipient's name and attributes when the address is on a list), built
//! and DKIM-signed as a campaign's messages are. Marketing-stream messages
//! carry List-Unsubscribe; transactional ones do not.

use std::sync::Arc;

use lettre::message::Mailbox;
use serde_json::{Map, Value};

use super::content::{Cache, Compiled, Sources, Vars};
use super::envelope::{with_sender, Verp};
use super::{dkim, headers, mime, on_the_wire, parse_from, ComposeError, Unsendable};
use crate::dkim::SigningKey;
use crate::mail::Composed;
use crate::store::message_templates::{MessageTemplate, Stream};
use crate::store::{dkim_keys, Conn};
use crate::templates::Rendered;
use crate::tokens::Identity;

/// The variables a message template may use besides the campaign ones.
/// `row`: a SQL-triggered flow step's row (the data's `row` member).
pub const MESSAGE_VARIABLES: &[&str] = &["data", "row"];

/// What one send of a template needs, read from the database at send time.
pub struct TemplateMail {
    pub template: MessageTemplate,
    pub compiled: Arc<Compiled>,
    pub from: Mailbox,
    pub domain: String,
    pub dkim: Arc<[Arc<SigningKey>]>,
    pub identity: Identity,
    /// The template's return path: each message's envelope sender names
    /// the message, so its bounce finds it.
    pub verp: Option<Verp>,
}

impl TemplateMail {
    /// Compile a stored template and read its From domain's DKIM keys.
    pub fn load(
        conn: &mut Conn,
        template: MessageTemplate,
        identity: &Identity,
    ) -> Result<TemplateMail, ComposeError> {
        Self::load_cached(conn, template, identity, &Cache::default())
    }

    /// [`TemplateMail::load`], taking the compiled template from `cache`
    /// (by template id and version: an edit makes a new version), so a
    /// worker compiles each version once, not once per message.
    pub fn load_cached(
        conn: &mut Conn,
        template: MessageTemplate,
        identity: &Identity,
        cache: &Cache,
    ) -> Result<TemplateMail, ComposeError> {
        let compiled = cache.get_or_compile((template.id, template.version), || {
            Compiled::with_vars(
                &Sources {
                    subject: ("subject", &template.subject),
                    body: Some([
                        ("HTML part", &template.html),
                        ("text part", &template.text_body),
                    ]),
                },
                &template.name,
                MESSAGE_VARIABLES,
            )
        })?;
        let from = parse_from(&template.from_addr)?;
        let verp = template
            .return_path
            .as_deref()
            .map(Verp::parse)
            .transpose()?;
        let domain = super::from_domain(&from);
        let keys = dkim_keys::for_domain(conn, &domain)?
            .iter()
            .map(SigningKey::cached)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TemplateMail {
            from: on_the_wire(from)
                .map_err(|_| ComposeError::BadFrom(template.from_addr.clone()))?,
            domain,
            dkim: keys.into(),
            identity: identity.clone(),
            verp,
            compiled,
            template,
        })
    }
}

/// Who a message goes to: the address and display name of `to`, and the
/// attributes the address has on the lists (empty for a stranger).
pub struct To<'a> {
    pub mailbox: &'a Mailbox,
    pub attributes: Map<String, Value>,
}

/// Compose message `id` of `mail` to `to` with `data`.
pub fn compose_message(
    mail: &TemplateMail,
    id: i64,
    to: &To,
    data: &Value,
) -> Result<Composed, Unsendable> {
    let invalid = |e: &dyn std::fmt::Display| Unsendable::Invalid(format!("{e:#}"));
    let name = to.mailbox.name.clone().unwrap_or_default();
    let email = to.mailbox.email.to_string();
    let marketing = mail.template.stream == Stream::Marketing;
    let leave = format!("mailto:{}?subject=unsubscribe", mail.from.email);
    let unsubscribe_url = if marketing { leave.as_str() } else { "" };
    let mut vars = Vars::new(
        &name,
        &email,
        &to.attributes,
        unsubscribe_url,
        &mail.template.name,
    );
    vars.data = Some(data.clone());
    vars.row = data.get("row").filter(|r| r.is_object()).cloned();
    let (subject, room) = mail.compiled.subject(&vars).map_err(|e| invalid(&e))?;
    vars.campaign.subject = Some(subject.clone());
    let (html, text) = mail
        .compiled
        .body(&vars, room)
        .map_err(|e| invalid(&e))?
        .unwrap_or_default();
    let token = format!("m{id}x{:x}", rand::random::<u32>());
    let message_id = headers::message_id(&token, &mail.identity.database_id, &mail.domain);
    let extra = if marketing {
        headers::list_unsubscribe(&leave, false)
    } else {
        Vec::new()
    };
    let mut message = mime(
        &mail.from,
        &subject,
        message_id,
        &name,
        &email,
        Rendered { html, text },
        extra,
    )?;
    if let Some(sender) = mail
        .verp
        .as_ref()
        .and_then(|v| v.for_message(&mail.identity, id))
    {
        message = with_sender(message, sender)?;
    }
    if message.bytes.len() > mail.compiled.max_message() {
        return Err(Unsendable::Invalid(format!(
            "the message exceeds the size cap of {} bytes",
            mail.compiled.max_message()
        )));
    }
    message.bytes =
        dkim::sign(&mail.dkim, message.bytes).map_err(|e| Unsendable::Invalid(e.to_string()))?;
    Ok(message)
}
