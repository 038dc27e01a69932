-- pgx's testsetup/postgresql_setup.sql (pgx v5.12.0), run in the pgx_test
-- database, without psql meta-commands: the test creates the role of the OS
-- user (pgx's `\set whoami` block) itself, because the Unix-socket
-- connection string has no user and connects as that role.

-- Extensions and types pgx's tests use.
create extension hstore;
create extension ltree;
create domain uint64 as numeric(20,0);

-- Users for the different kinds of connection and authentication.
create user pgx_ssl with superuser password 'secret';
create user pgx_sslcert with superuser password 'secret';
set password_encryption = md5;
create user pgx_md5 with superuser password 'secret';
set password_encryption = 'scram-sha-256';
create user pgx_pw with superuser password 'secret';
create user pgx_scram with superuser password 'secret';
create user pgx_oauth with superuser;

-- A role name with special characters, used by pgx's aclitem tests
-- (pgtype/text_test.go); aclitems cannot name roles that do not exist.
create user " tricky, ' } "" \ test user " superuser password 'secret';
