ALTER TABLE campaigns DROP COLUMN max_complaint_rate;
