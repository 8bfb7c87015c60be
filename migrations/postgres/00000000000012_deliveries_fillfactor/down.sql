ALTER TABLE deliveries RESET (fillfactor);
