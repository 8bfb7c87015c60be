DROP TABLE unverified_reports;
