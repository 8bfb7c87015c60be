DROP INDEX engagement_by_recipient;
