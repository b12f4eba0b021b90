"""The fleet tests: several daemons, PostgreSQL, moto S3 and HTTP origins on this machine."""
