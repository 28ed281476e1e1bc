"""The audit trail (audit.md): one row per `/api/` execution, in SQLite or PostgreSQL.

- `ids`: execution ids (`exec_<ms>_<gateway>_<node>_<seq>`), on every `/api/` answer as X-Execution-ID;
- `rows`: an execution in memory, and the `audit_log` columns and states;
- `trail`: the hooks on the request's path (memory and one journal line) and the writer task off it;
- `journal`: each gateway's local journal, so that a crash loses no row and leaves none unfinished;
- `store`: the two stores behind one blocking interface, schema and migrations;
- `queries`: what `GET /admin/audit` and `hairgate audit` read;
- `command`: `hairgate audit show|key|retries|failures`.
"""
