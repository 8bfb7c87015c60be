//! Diesel table definitions, written by hand to match `migrations/`.
//! Both backends share them: ids and timestamps are BIGINT everywhere.

mod message_tables;
pub use message_tables::{message_engagement, message_templates, messages};

diesel::table! {
    lists (id) {
        id -> BigInt,
        name -> Text,
        created_at -> BigInt,
        /// The latest import's generation.
        import_gen -> BigInt,
        /// What the subscribers' pages call the list (`list create --title`).
        title -> Nullable<Text>,
        /// Offered by `/subscribe` and the preference centre.
        is_public -> Bool,
        /// Joining through `/subscribe` waits for a confirmed mail.
        double_opt_in -> Bool,
    }
}

diesel::table! {
    recipients (id) {
        id -> BigInt,
        email -> Text,
        name -> Text,
        attributes -> Text,
        status -> Text,
        updated_at -> BigInt,
        status_reason -> Nullable<Text>,
        status_at -> Nullable<BigInt>,
        /// The mailbox's identity (`crate::mailbox::key`);
        /// NULL only on twins left by older imports.
        email_key -> Nullable<Text>,
        /// When `/api/v1` first wrote the subscriber.
        created_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    list_members (list_id, recipient_id) {
        list_id -> BigInt,
        recipient_id -> BigInt,
        /// The import that last named the member.
        import_gen -> Nullable<BigInt>,
    }
}

diesel::table! {
    campaigns (id) {
        id -> BigInt,
        name -> Text,
        list_id -> BigInt,
        template -> Text,
        subject -> Text,
        from_addr -> Text,
        priority -> BigInt,
        state -> Text,
        paused -> Bool,
        enqueue_cursor -> BigInt,
        pending_upto -> Nullable<BigInt>,
        created_at -> BigInt,
        updated_at -> BigInt,
        public_url -> Nullable<Text>,
        return_path -> Nullable<Text>,
        max_failure_rate -> Nullable<Double>,
        pause_reason -> Nullable<Text>,
        /// The `enqueue` run holding the campaign, and until
        /// when (ms).
        enqueue_owner -> Nullable<Text>,
        enqueue_lease_until -> Nullable<BigInt>,
        /// The servers of the in-doubt window (see
        /// `campaigns::Intent`).
        pending_servers -> Nullable<Text>,
        /// When it may start (ms); NULL: once enqueued.
        send_at -> Nullable<BigInt>,
        /// Complaints per delivered message that pause it; NULL: off.
        max_complaint_rate -> Nullable<Double>,
    }
}

diesel::table! {
    campaign_counters (campaign_id) {
        campaign_id -> BigInt,
        recipients -> BigInt,
        enqueued -> BigInt,
        jobs -> BigInt,
        sent -> BigInt,
        failed -> BigInt,
        skipped -> BigInt,
        enqueue_skipped -> BigInt,
        window_at -> BigInt,
        window_done -> BigInt,
        rate -> Double,
        first_at -> Nullable<BigInt>,
        last_at -> Nullable<BigInt>,
        bounced -> BigInt,
        complaints -> BigInt,
        fail_streak -> BigInt,
        recent_done -> BigInt,
        recent_failed -> BigInt,
        prior_done -> BigInt,
        prior_failed -> BigInt,
        /// When the campaign was seen done (reported once
        /// as `campaign.finished`).
        finished_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    deliveries (campaign_id, recipient_id) {
        campaign_id -> BigInt,
        recipient_id -> BigInt,
        state -> Text,
        attempts -> Integer,
        claim_token -> Nullable<BigInt>,
        claimed_until -> Nullable<BigInt>,
        last_error -> Nullable<Text>,
        updated_at -> BigInt,
        bounced_at -> Nullable<BigInt>,
        complained_at -> Nullable<BigInt>,
        /// The content version a sent message had.
        content_version -> Nullable<BigInt>,
        /// The A/B variant it was given (0 = A; NULL: no A/B test).
        variant -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// Reports nobody can vouch for; they changed nobody.
    unverified_reports (id) {
        id -> BigInt,
        fingerprint -> Text,
        format -> Text,
        kind -> Nullable<Text>,
        addresses -> BigInt,
        sample -> Text,
        why -> Text,
        received_at -> BigInt,
    }
}

diesel::joinable!(list_members -> recipients (recipient_id));
diesel::joinable!(list_members -> lists (list_id));
diesel::joinable!(campaigns -> lists (list_id));
diesel::joinable!(campaign_counters -> campaigns (campaign_id));

diesel::table! {
    /// Admin login sessions (see `store::sessions`).
    admin_sessions (id) {
        id -> Text,
        token_fp -> Text,
        created_at -> BigInt,
        expires_at -> BigInt,
    }
}

diesel::table! {
    /// Sign-ups through `/subscribe` waiting for their confirmation
    /// (see `store::signups`).
    signups (id) {
        id -> BigInt,
        email -> Text,
        email_key -> Text,
        name -> Text,
        list_ids -> Text,
        created_at -> BigInt,
        confirmed_at -> Nullable<BigInt>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    lists,
    recipients,
    list_members,
    campaigns,
    campaign_counters,
    deliveries,
    bounces,
    engagement,
    campaign_engagement,
    campaign_links,
);

diesel::table! {
    rate_usage (worker, name) {
        worker -> Text,
        name -> Text,
        spent -> BigInt,
        spent_rate -> Double,
        parked -> BigInt,
        deferred -> BigInt,
        seen_at -> BigInt,
    }
}

diesel::table! {
    rate_groups (name) {
        name -> Text,
        rate -> Double,
        burst -> BigInt,
        tat -> BigInt,
        leased -> BigInt,
        window_at -> BigInt,
        window_leased -> BigInt,
        observed -> Double,
        updated_at -> BigInt,
        factor -> Double,
        ceiling -> Double,
        cut_at -> BigInt,
        adapted_at -> BigInt,
        adapted_reason -> Nullable<Text>,
    }
}

diesel::table! {
    installation (singleton) {
        singleton -> Integer,
        database_id -> Text,
        secret -> Text,
        created_at -> BigInt,
    }
}

diesel::table! {
    /// A rate group's warm-up schedule (see `store::warmups`).
    rate_warmups (name) {
        name -> Text,
        start_rate -> Double,
        factor -> Double,
        every_ms -> BigInt,
        until_rate -> Double,
        since_ms -> BigInt,
        period -> BigInt,
        used -> BigInt,
    }
}

diesel::table! {
    dkim_keys (domain, selector) {
        domain -> Text,
        selector -> Text,
        algorithm -> Text,
        private_key -> Text,
        public_key -> Text,
        created_at -> BigInt,
        state -> Text,
    }
}

diesel::table! {
    bounces (id) {
        id -> BigInt,
        recipient_id -> BigInt,
        campaign_id -> Nullable<BigInt>,
        email -> Text,
        kind -> Text,
        status -> Nullable<Text>,
        reason -> Text,
        source -> Text,
        fingerprint -> Text,
        received_at -> BigInt,
    }
}

diesel::table! {
    workers (id) {
        id -> Text,
        host -> Text,
        pid -> BigInt,
        version -> Text,
        binary_hash -> Text,
        binary_size -> BigInt,
        binary_mtime -> BigInt,
        relay -> Text,
        concurrency -> BigInt,
        state -> Text,
        started_at -> BigInt,
        seen_at -> BigInt,
        sent -> BigInt,
        rate -> Double,
        tube -> Text,
        foreign_jobs -> BigInt,
        foreign_databases -> Text,
    }
}

diesel::table! {
    /// Shared connection limits per relay group.
    connection_limits (name) {
        name -> Text,
        connections -> BigInt,
        updated_at -> BigInt,
    }
}

diesel::table! {
    /// The connection slots each worker holds, until `until` (ms).
    connection_leases (name, owner) {
        name -> Text,
        owner -> Text,
        slots -> BigInt,
        waiting -> BigInt,
        until -> BigInt,
    }
}

diesel::table! {
    /// Each content version of a campaign.
    campaign_content (campaign_id, version) {
        campaign_id -> BigInt,
        version -> BigInt,
        kind -> Text,
        subject -> Text,
        html -> Text,
        text -> Text,
        created_at -> BigInt,
        /// What this version tracks.
        track -> Text,
        /// 0: the campaign's own content; n: A/B variant n's.
        variant -> BigInt,
    }
}

diesel::table! {
    /// Each tracked content version's links.
    campaign_links (campaign_id, version, n) {
        campaign_id -> BigInt,
        version -> BigInt,
        n -> BigInt,
        url -> Text,
        clicks -> BigInt,
    }
}

diesel::table! {
    /// Opens, clicks and unsubscribes per recipient and campaign.
    engagement (campaign_id, recipient_id) {
        campaign_id -> BigInt,
        recipient_id -> BigInt,
        first_open_at -> Nullable<BigInt>,
        opens -> BigInt,
        first_machine_open_at -> Nullable<BigInt>,
        machine_opens -> BigInt,
        first_click_at -> Nullable<BigInt>,
        clicks -> BigInt,
        unsubscribed_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// Engagement counters per campaign.
    campaign_engagement (campaign_id) {
        campaign_id -> BigInt,
        opened -> BigInt,
        opens -> BigInt,
        machine_opened -> BigInt,
        machine_opens -> BigInt,
        clicked -> BigInt,
        clicks -> BigInt,
        unsubscribed -> BigInt,
    }
}

diesel::table! {
    /// Campaigns deleted after `enqueue`, whose jobs workers
    /// drop when they meet them.
    deleted_campaigns (id) {
        id -> BigInt,
        name -> Text,
        deleted_at -> BigInt,
    }
}

diesel::table! {
    /// Signed event webhooks out.
    webhooks (id) {
        id -> BigInt,
        url -> Text,
        events -> Text,
        secret -> Text,
        created_at -> BigInt,
        lease_owner -> Nullable<Text>,
        lease_until -> BigInt,
        next_at -> BigInt,
        attempts -> BigInt,
        delivered -> BigInt,
        failed -> BigInt,
        posts -> BigInt,
        last_error -> Nullable<Text>,
        last_error_at -> Nullable<BigInt>,
        last_ok_at -> Nullable<BigInt>,
        /// May point at loopback or link-local addresses.
        allow_local -> Bool,
    }
}

diesel::table! {
    /// One row per (webhook, event) until delivered.
    webhook_outbox (id) {
        id -> BigInt,
        webhook_id -> BigInt,
        kind -> Text,
        campaign_id -> Nullable<BigInt>,
        recipient_id -> Nullable<BigInt>,
        at -> BigInt,
        /// A `clicked` event's link (content version, number).
        link_version -> Nullable<BigInt>,
        link_n -> Nullable<BigInt>,
        /// A `clicked` event's URL when the template wrote the link.
        link_url -> Nullable<Text>,
        /// An event about a transactional message.
        message_id -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// Clicks on links a template wrote, by URL.
    campaign_template_links (campaign_id, url) {
        campaign_id -> BigInt,
        url -> Text,
        clicks -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(webhook_outbox, webhooks);
diesel::allow_tables_to_appear_in_same_query!(webhook_outbox, campaign_links);
diesel::allow_tables_to_appear_in_same_query!(webhook_outbox, campaigns);
diesel::allow_tables_to_appear_in_same_query!(webhook_outbox, recipients);

diesel::table! {
    /// `/api/v1` keys (see `store::api_keys`).
    api_keys (name) {
        name -> Text,
        key_hash -> Text,
        scopes -> Text,
        created_at -> BigInt,
        last_used_at -> Nullable<BigInt>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(webhook_outbox, messages);
diesel::allow_tables_to_appear_in_same_query!(messages, message_engagement);
diesel::allow_tables_to_appear_in_same_query!(messages, campaigns);
diesel::allow_tables_to_appear_in_same_query!(messages, recipients);
diesel::allow_tables_to_appear_in_same_query!(messages, campaign_links);

diesel::table! {
    /// The global suppression list (see `store::suppressions`).
    suppressions (entry) {
        entry -> Text,
        reason -> Text,
        created_at -> BigInt,
    }
}

diesel::table! {
    /// Archived (finished) campaigns, hidden from the dashboard (see
    /// `store::archive`).
    campaign_archive (campaign_id) {
        campaign_id -> BigInt,
        archived_at -> BigInt,
    }
}
