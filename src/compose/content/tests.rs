use super::problems::BUILTIN_FILTERS;
use super::*;

/// `templates show` prints sources that render what the built-in
/// templates render.
#[test]
fn starters_render_as_the_built_in_templates() {
    let mut attrs = Map::new();
    attrs.insert("city".into(), Value::String("Lyon <Rhône>".into()));
    attrs.insert("plan".into(), Value::String("Gold".into()));
    let none = Map::new();
    let norm = |s: &str| {
        [
            ("&#x2f;", "/"),
            ("&#38;", "&amp;"),
            ("&#60;", "&lt;"),
            ("&#62;", "&gt;"),
            ("&#34;", "&quot;"),
            ("&#x27;", "&#39;"),
        ]
        .iter()
        .fold(s.to_string(), |s, (a, b)| s.replace(a, b))
        .trim_end()
        .to_string()
    };
    for name in crate::templates::TEMPLATES {
        let (html, text) = crate::templates::starter(name).unwrap();
        let c = Compiled::new(
            &Sources {
                subject: ("--subject", "News & more"),
                body: Some([("h", html), ("t", text)]),
            },
            "c",
        )
        .unwrap();
        for (who, a) in [("Ada", &attrs), ("", &none)] {
            let url = "https://x.test/u/1?a=b";
            let mut vars = Vars::new(who, "ada@x.test", a, url, "c");
            vars.campaign.subject = Some("News & more".into());
            let (h, t) = c.body(&vars, DEFAULT_MAX_MESSAGE).unwrap().unwrap();
            let ctx = crate::templates::Context {
                subject: "News & more",
                name: who,
                email: "ada@x.test",
                attributes: a,
                unsubscribe_url: url,
            };
            let built = crate::templates::render(name, &ctx).unwrap();
            assert_eq!(norm(&h), norm(&built.html), "{name} html");
            assert_eq!(norm(&t), norm(&built.text), "{name} text");
        }
    }
}

fn compile(html: &str, text: &str) -> Result<Compiled, TemplateProblem> {
    Compiled::new(
        &Sources {
            subject: ("--subject", "Hi {{ name | default(\"friend\") }}"),
            body: Some([("a.html", html), ("a.txt", text)]),
        },
        "spring",
    )
}

#[test]
fn the_cache_compiles_each_version_once() {
    let cache = Cache::default();
    let mut compiled = 0;
    for key in [(1, 1), (1, 1), (1, 1), (1, 2), (2, 1), (1, 2)] {
        cache
            .get_or_compile(key, || {
                compiled += 1;
                compile("<p>{{ name }}</p>", "{{ name }}")
            })
            .unwrap();
    }
    assert_eq!((compiled, cache.len()), (3, 3));
}

#[test]
fn escapes_html_only_and_leaves_missing_values_empty() {
    let c = compile(
        "<p>{{ name }} {{ attributes.city }}|{{ attributes.zip }}|{{ campaign.name }}</p>",
        "{{ name }} {{ attributes.city | default(\"nowhere\") }}",
    )
    .unwrap();
    let mut attrs = Map::new();
    attrs.insert("city".into(), Value::String("A&B".into()));
    let vars = Vars::new("<b>Bob</b>", "b@x.test", &attrs, "u", "spring");
    let (html, text) = c.body(&vars, DEFAULT_MAX_MESSAGE).unwrap().unwrap();
    assert_eq!(html, "<p>&lt;b&gt;Bob&lt;&#x2f;b&gt; A&amp;B||spring</p>");
    assert_eq!(text, "<b>Bob</b> A&B");
    let nobody = Vars::new("", "b@x.test", &Map::new(), "u", "spring");
    assert_eq!(c.subject(&nobody).unwrap().0, "Hi friend");
}

#[test]
fn refuses_syntax_errors_unknown_names_and_includes_with_the_line() {
    let e = compile("<p>\n{{ name </p>", "t").unwrap_err();
    assert_eq!((e.file.as_str(), e.line), ("a.html", Some(2)), "{e}");
    let e = compile("<p>\n\n{{ nmae }}</p>", "t").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.problem.contains("nmae"), "{e}");
    let e = compile("x", "{% include \"/etc/passwd\" %}").unwrap_err();
    assert_eq!(e.file, "a.txt", "{e}");
    let e = compile("{{ name | nosuchfilter }}", "t").unwrap_err();
    assert!(e.problem.contains("nosuchfilter"), "{e}");
    let e = compile("{{ name | defualt('x') }}", "t").unwrap_err();
    assert_eq!(
        e.problem, "unknown filter `defualt`: did you mean `default`?",
        "{e}"
    );
}

#[test]
fn every_listed_filter_is_one_of_the_engine() {
    let env = engine();
    for name in BUILTIN_FILTERS {
        let probe = format!("{{{{ '{name}' is filter }}}}");
        assert_eq!(env.render_str(&probe, ()).unwrap(), "True", "{name}");
    }
    let none = env.render_str("{{ 'defualt' is filter }}", ()).unwrap();
    assert_eq!(none, "False", "the probe tells a missing filter");
}

/// Fuel one render of `source` uses, as the HTML part, for a recipient.
fn fuel_of(source: &str) -> u64 {
    let mut env = engine();
    env.set_fuel(Some(u64::MAX / 128));
    env.add_template_owned(HTML.to_string(), source.to_string())
        .unwrap();
    let mut attrs = Map::new();
    attrs.insert("city".into(), Value::String("Lyon".into()));
    let vars = Vars::new("Ada", "a@x.test", &attrs, "https://x.test/u", "c");
    let template = env.get_template(HTML).unwrap();
    let captured = template
        .render_captured(minijinja::value::Serde(&vars))
        .unwrap();
    captured.state().fuel_levels().unwrap().0
}

/// A newsletter of 200 products, each with a link, an image and a
/// few filters (about 57 kB of HTML).
fn catalogue(products: usize) -> String {
    let items: Vec<String> = (0..products)
        .map(|i| {
            format!(
                "{{\"name\": \"wireless headphones model {i}\", \"price\": {}.99, \
                 \"url\": \"https://shop.example/p/{i}\", \"image\": \"https://cdn.example/p/{i}.jpg\", \
                 \"tags\": [\"audio\", \"sale\"]}}",
                10 + i
            )
        })
        .collect();
    format!(
        "<html><body><h1>Hello {{{{ name | default(\"friend\") | title }}}}</h1>\
         {{% set products = [{}] %}}<table>{{% for p in products %}}\
         {{% if loop.index0 is even %}}<tr>{{% endif %}}<td>\
         <a href=\"{{{{ p.url }}}}?city={{{{ attributes.city | default('') | lower }}}}\">\
         <img src=\"{{{{ p.image }}}}\" alt=\"{{{{ p.name | title }}}}\"></a>\
         <h2>{{{{ p.name | title | replace('Model', 'No.') }}}}</h2>\
         <p>{{{{ \"%.2f\" | format(p.price * 0.9) }}}} EUR instead of {{{{ p.price | round(2) }}}}, \
         {{{{ p.tags | join(', ') | upper }}}}</p></td>{{% if loop.index0 is odd %}}</tr>{{% endif %}}\
         {{% endfor %}}</table><p><a href=\"{{{{ unsubscribe_url }}}}\">Unsubscribe</a></p></body></html>",
        items.join(", ")
    )
}

#[test]
fn the_starters_and_a_large_newsletter_use_a_small_part_of_the_budget() {
    for name in crate::templates::TEMPLATES {
        let (html, text) = crate::templates::starter(name).unwrap();
        assert!(fuel_of(html) * 1_000 < RENDER_FUEL, "{name}");
        assert!(fuel_of(text) * 1_000 < RENDER_FUEL, "{name}");
    }
    let used = fuel_of(&catalogue(200));
    assert!(used * 10 < RENDER_FUEL, "{used}");
    compile(&catalogue(200), "t").unwrap();
}

#[test]
fn a_template_spinning_for_one_recipient_ends_by_its_fuel() {
    let spin = "{% if attributes.spin %}{% for i in range(100000) %}\
                {% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}ok";
    let c = compile(spin, "t").unwrap();
    let mut attrs = Map::new();
    attrs.insert("spin".into(), Value::String("yes".into()));
    let vars = Vars::new("Bob", "b@x.test", &attrs, "u", "spring");
    let e = c.body(&vars, DEFAULT_MAX_MESSAGE).unwrap_err();
    assert!(matches!(e, RenderError::Budget), "{e}");
    assert!(e.to_string().contains("render budget"), "{e}");
    let calm = Vars::new("Bob", "b@x.test", &Map::new(), "u", "spring");
    assert_eq!(c.body(&calm, DEFAULT_MAX_MESSAGE).unwrap().unwrap().0, "ok");
    // A template that spins for the sample recipient is refused.
    let e = compile(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "t",
    )
    .unwrap_err();
    assert!(e.problem.contains("render budget"), "{e}");
}

#[test]
fn output_stops_at_the_size_cap_and_huge_values_are_never_made() {
    let cache = Cache::with_max_message(100_000);
    let big = "{% if attributes.big %}{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}{% endif %}";
    let c = cache.get_or_compile((1, 1), || compile(big, "t")).unwrap();
    let mut attrs = Map::new();
    attrs.insert("big".into(), Value::String("yes".into()));
    let vars = Vars::new("Bob", "b@x.test", &attrs, "u", "spring");
    let e = c.body(&vars, c.max_message()).unwrap_err();
    assert!(matches!(e, RenderError::TooLarge { cap: 100_000 }), "{e}");
    assert!(e.to_string().contains("size cap of 100000 bytes"), "{e}");
    // What the subject wrote counts against the same cap.
    let e = c
        .body(&Vars::new("B", "b@x.test", &Map::new(), "u", "s"), 0)
        .unwrap_err();
    assert!(matches!(e, RenderError::TooLarge { .. }), "{e}");
    let huge = compile("{{ 'x' * attributes.n | int }}", "t").unwrap();
    let mut attrs = Map::new();
    attrs.insert("n".into(), Value::String("100000000".into()));
    let vars = Vars::new("Bob", "b@x.test", &attrs, "u", "spring");
    let e = huge.body(&vars, usize::MAX).unwrap_err();
    assert!(matches!(e, RenderError::Budget), "{e}");
}

/// A plain-text subject is taken as it is (what minijinja would render,
/// and the room it leaves); one with a tag, or a line break minijinja
/// drops, is still rendered per recipient.
#[test]
fn a_plain_subject_is_not_rendered_per_message_and_a_template_one_is() {
    let subject = |source: &str, who: &str| {
        let sources = Sources {
            subject: ("--subject", source),
            body: None,
        };
        let c = Compiled::new(&sources, "c").unwrap();
        let vars = Vars::new(who, "b@x.test", &Map::new(), "u", "c");
        (c.literal_subject.clone(), c.subject(&vars).unwrap())
    };
    let plain = "Spring & more: 50% off";
    assert_eq!(
        subject(plain, "Ann"),
        (
            Some(plain.to_string()),
            (plain.to_string(), DEFAULT_MAX_MESSAGE - plain.len())
        )
    );
    let (literal, (text, _)) = subject("Hi {{ name }}", "Ann");
    assert_eq!((literal, text.as_str()), (None, "Hi Ann"));
    let (literal, (text, _)) = subject("News\n", "Ann");
    assert_eq!((literal, text.as_str()), (None, "News"));

    let mut c = Compiled::new(
        &Sources {
            subject: ("--subject", plain),
            body: None,
        },
        "c",
    )
    .unwrap();
    c.set_max_message(plain.len() - 1);
    let vars = Vars::new("Ann", "b@x.test", &Map::new(), "u", "c");
    assert!(matches!(
        c.subject(&vars),
        Err(RenderError::TooLarge { .. })
    ));
}
