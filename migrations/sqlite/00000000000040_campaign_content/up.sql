-- Campaign content written at run time (issue 24): the subject, HTML and
-- text Jinja templates of each content version, and where they came from
-- (html, markdown, or a built-in starter `template`, whose parts stay
-- compiled into the binary). Workers read the newest version.
CREATE TABLE campaign_content (
    campaign_id BIGINT NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    html TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (campaign_id, version)
);
