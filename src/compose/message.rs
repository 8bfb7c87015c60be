//! One transactional message exactly as it goes on the wire: the message
//! template's stored content rendered with the message's `data` (and the
//! recipient's name and attributes when the address is on a list), built
//! and DKIM-signed as a campaign's messages are. Marketing-stream messages
//! carry List-Unsubscribe; transactional ones do not.

use std::sync::Arc;

use lettre::message::Mailbox;
use serde_json::{Map, Value};

use super::content::{Cache, Compiled, Sources, TemplateProblem, Vars};
use super::envelope::{with_sender, Verp};
use super::tracking::{self, Links};
use super::tracking_urls::TrackingUrls;
use super::{dkim, headers, mime, on_the_wire, parse_from, ComposeError, Unsendable};
use crate::dkim::SigningKey;
use crate::mail::Composed;
use crate::store::content::Track;
use crate::store::message_templates::{MessageTemplate, Stream};
use crate::store::messages::{self, MessageStatus};
use crate::store::{dkim_keys, installation, message_templates, Conn};
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
            compile_template(&template)
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

/// A template's parts compiled, rewritten for tracking when it tracks
/// and has a public URL. Its links are numbered afresh from the parts
/// (the same every time), and their click URLs carry the URL itself, so
/// no table outlives an edit.
fn compile_template(t: &MessageTemplate) -> Result<Compiled, TemplateProblem> {
    let subject = ("subject", t.subject.as_str());
    let track = Track::from_column(&t.track);
    let Some(base) = t.public_url.as_deref().filter(|_| track.any()) else {
        let body = Some([("HTML part", t.html.as_str()), ("text part", &t.text_body)]);
        return Compiled::with_vars(&Sources { subject, body }, &t.name, MESSAGE_VARIABLES);
    };
    let mut links = Links::new();
    let (html, text) = tracking::rewrite(&t.html, &t.text_body, track, base, &mut links);
    let body = Some([("HTML part", html.as_str()), ("text part", text.as_str())]);
    let targets = links.into_urls();
    let mut compiled = Compiled::tracked_with(
        &Sources { subject, body },
        &t.name,
        targets.len(),
        MESSAGE_VARIABLES,
    )?;
    compiled.tracking = Some(TrackingUrls {
        base: base.trim_end_matches('/').to_string(),
        version: t.version,
        opens: track.opens,
        links: targets.len(),
        clicks: track.clicks,
        targets,
    });
    Ok(compiled)
}

/// Who a message goes to: the address and display name of `to`, and the
/// attributes the address has on the lists (empty for a stranger), and
/// its recipient id if it is on one.
pub struct To<'a> {
    pub mailbox: &'a Mailbox,
    pub attributes: Map<String, Value>,
    pub recipient: Option<i64>,
}

/// `(preferences_url, view_url)` of message `id` of `mail`: a
/// marketing-stream template's with a public URL (the preference centre
/// needs the recipient on a list); empty otherwise.
fn own_urls(mail: &TemplateMail, id: i64, recipient: Option<i64>) -> (String, String) {
    let base = match &mail.template.public_url {
        Some(base) if mail.template.stream == Stream::Marketing => base.trim_end_matches('/'),
        _ => return (String::new(), String::new()),
    };
    let signer = &mail.identity.signer;
    let preferences = recipient
        .map(|r| format!("{base}/p/{}", signer.message_preferences_token(id, r)))
        .unwrap_or_default();
    (
        preferences,
        format!("{base}/v/{}", signer.message_view_token(id)),
    )
}

/// Compose message `id` of `mail` to `to` with `data`.
pub fn compose_message(
    mail: &TemplateMail,
    id: i64,
    to: &To,
    data: &Value,
) -> Result<Composed, Unsendable> {
    let name = to.mailbox.name.clone().unwrap_or_default();
    let email = to.mailbox.email.to_string();
    let marketing = mail.template.stream == Stream::Marketing;
    let leave = format!("mailto:{}?subject=unsubscribe", mail.from.email);
    let (subject, rendered) = render_message(mail, id, to, data)?;
    let token = format!("m{id}x{:x}", rand::random::<u32>());
    let message_id = headers::message_id(&token, &mail.identity.database_id, &mail.domain);
    let extra = if marketing {
        headers::list_unsubscribe(&leave, false)
    } else {
        Vec::new()
    };
    let mut message = mime(
        &mail.from, &subject, message_id, &name, &email, rendered, extra,
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

/// The subject and parts of message `id` of `mail` to `to` with `data`,
/// as [`compose_message`] puts them on the wire.
fn render_message(
    mail: &TemplateMail,
    id: i64,
    to: &To,
    data: &Value,
) -> Result<(String, Rendered), Unsendable> {
    let invalid = |e: &dyn std::fmt::Display| Unsendable::Invalid(format!("{e:#}"));
    let name = to.mailbox.name.clone().unwrap_or_default();
    let email = to.mailbox.email.to_string();
    let leave = format!("mailto:{}?subject=unsubscribe", mail.from.email);
    let unsubscribe_url = match mail.template.stream {
        Stream::Marketing => leave.as_str(),
        Stream::Transactional => "",
    };
    let mut vars = Vars::new(
        &name,
        &email,
        &to.attributes,
        unsubscribe_url,
        &mail.template.name,
    );
    vars.data = Some(data.clone());
    vars.row = data.get("row").filter(|r| r.is_object()).cloned();
    (vars.preferences_url, vars.view_url) = own_urls(mail, id, to.recipient);
    if let Some(t) = &mail.compiled.tracking {
        let urls = t.message_urls(&mail.identity.signer, id);
        vars.open_url = urls.open;
        vars.links = urls.links;
        vars.linker = urls.linker;
    }
    let (subject, room) = mail.compiled.subject(&vars).map_err(|e| invalid(&e))?;
    vars.campaign.subject = Some(subject.clone());
    let (html, text) = mail
        .compiled
        .body(&vars, room)
        .map_err(|e| invalid(&e))?
        .unwrap_or_default();
    Ok((subject, Rendered { html, text }))
}

/// Sent message `id` as its recipient's `/v/` page shows it: rendered
/// again for them, as a worker renders it, from its template as it is
/// now (links intact); `None` when it was not sent or its template is
/// gone.
pub fn sent_message(conn: &mut Conn, id: i64) -> Result<Option<(String, Rendered)>, ComposeError> {
    let Some(m) = messages::find(conn, id)? else {
        return Ok(None);
    };
    let sent = matches!(m.status, MessageStatus::Sent | MessageStatus::Bounced);
    let template = message_templates::by_id(conn, m.template_id)?;
    let (true, Some(template), Ok(mailbox)) = (sent, template, m.to_addr.parse::<Mailbox>()) else {
        return Ok(None);
    };
    let key = crate::mailbox::key(mailbox.email.as_ref()).unwrap_or_default();
    let (recipient, attributes) = messages::recipient_of_key(conn, &key)?;
    let identity = Identity::from(&installation::load(conn)?);
    let mail = TemplateMail::load(conn, template, &identity)?;
    let to = To {
        mailbox: &mailbox,
        attributes: serde_json::from_str(&attributes).unwrap_or_default(),
        recipient,
    };
    let data = serde_json::from_str(&m.data).unwrap_or(Value::Object(Map::new()));
    render_message(&mail, id, &to, &data)
        .map(Some)
        .map_err(|e| ComposeError::Unsendable {
            email: m.to_addr.clone(),
            why: format!("{e:?}"),
        })
}
