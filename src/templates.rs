//! The compiled-in templates (askama, from `templates/`). Each named template
//! has an HTML part and a plain-text part rendered from the same context.
//! Adding one means adding its two files, a pair of structs and a line in
//! [`TEMPLATES`]; running workers pick it up when they restart on the new
//! binary.

use askama::Template;
use serde_json::{Map, Value};

/// Every template name `campaign create --template` accepts.
pub const TEMPLATES: &[&str] = &["newsletter", "announcement"];

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("unknown template {0:?}; templates: {list}", list = TEMPLATES.join(", "))]
    Unknown(String),
    #[error("rendering template {name}")]
    Render {
        name: String,
        #[source]
        source: askama::Error,
    },
}

/// Everything a template can use.
pub struct Context<'a> {
    pub subject: &'a str,
    pub name: &'a str,
    pub email: &'a str,
    /// Extra CSV columns of the recipient.
    pub attributes: &'a Map<String, Value>,
    pub unsubscribe_url: &'a str,
}

impl Context<'_> {
    /// An attribute as text; empty when the recipient has none.
    pub fn attr(&self, key: &str) -> String {
        match self.attributes.get(key) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    }
    /// The recipient's name, or a neutral greeting when it is missing.
    pub fn greeting_name(&self) -> &str {
        if self.name.trim().is_empty() {
            "subscriber"
        } else {
            self.name
        }
    }
    pub fn city(&self) -> String {
        self.attr("city")
    }
}

// One struct per part; each derefs to the shared context so templates can
// write `{{ email }}` and `{{ attr("city") }}`.
macro_rules! deref_context {
    ($($part:ident),*) => {$(
        impl<'a> std::ops::Deref for $part<'a> {
            type Target = Context<'a>;
            fn deref(&self) -> &Context<'a> {
                self.ctx
            }
        }
    )*};
}

#[derive(Template)]
#[template(path = "newsletter.html")]
struct NewsletterHtml<'a> {
    ctx: &'a Context<'a>,
}
#[derive(Template)]
#[template(path = "newsletter.txt")]
struct NewsletterText<'a> {
    ctx: &'a Context<'a>,
}
#[derive(Template)]
#[template(path = "announcement.html")]
struct AnnouncementHtml<'a> {
    ctx: &'a Context<'a>,
}
#[derive(Template)]
#[template(path = "announcement.txt")]
struct AnnouncementText<'a> {
    ctx: &'a Context<'a>,
}
deref_context!(
    NewsletterHtml,
    NewsletterText,
    AnnouncementHtml,
    AnnouncementText
);

/// The two parts of one rendered message.
pub struct Rendered {
    pub html: String,
    pub text: String,
}

/// Check a template name.
pub fn check(name: &str) -> Result<(), TemplateError> {
    if TEMPLATES.contains(&name) {
        Ok(())
    } else {
        Err(TemplateError::Unknown(name.to_string()))
    }
}

/// A built-in template as a starter for the user's own content: its HTML
/// and text parts in Jinja syntax (`campaign create --html/--text`), which
/// render exactly what the compiled-in template renders (a test checks).
pub fn starter(name: &str) -> Result<(&'static str, &'static str), TemplateError> {
    match name {
        "newsletter" => Ok((
            include_str!("../templates/starters/newsletter.html"),
            include_str!("../templates/starters/newsletter.txt"),
        )),
        "announcement" => Ok((
            include_str!("../templates/starters/announcement.html"),
            include_str!("../templates/starters/announcement.txt"),
        )),
        other => Err(TemplateError::Unknown(other.to_string())),
    }
}

/// Render both parts of the named template.
pub fn render(name: &str, ctx: &Context) -> Result<Rendered, TemplateError> {
    let err = |source| TemplateError::Render {
        name: name.to_string(),
        source,
    };
    let (html, text) = match name {
        "newsletter" => (
            NewsletterHtml { ctx }.render(),
            NewsletterText { ctx }.render(),
        ),
        "announcement" => (
            AnnouncementHtml { ctx }.render(),
            AnnouncementText { ctx }.render(),
        ),
        other => return Err(TemplateError::Unknown(other.to_string())),
    };
    Ok(Rendered {
        html: html.map_err(err)?,
        text: text.map_err(err)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_template_with_and_without_attributes() {
        let mut attrs = Map::new();
        attrs.insert("city".into(), Value::String("Lyon <Rhône>".into()));
        let empty = Map::new();
        for name in TEMPLATES {
            for (who, a) in [("Ada", &attrs), ("", &empty)] {
                let ctx = Context {
                    subject: "News",
                    name: who,
                    email: "ada@example.test",
                    attributes: a,
                    unsubscribe_url: "https://example.test/u/1",
                };
                let out = render(name, &ctx).unwrap();
                assert!(out
                    .text
                    .contains(if who.is_empty() { "subscriber" } else { who }));
                assert!(out.html.contains("https://example.test/u/1"));
                assert!(
                    !out.html.contains("<Rhône>"),
                    "HTML part must escape attributes"
                );
            }
        }
        assert!(matches!(check("nope"), Err(TemplateError::Unknown(_))));
    }
}
