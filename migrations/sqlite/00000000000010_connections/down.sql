DROP TABLE connection_leases;
DROP TABLE connection_limits;
