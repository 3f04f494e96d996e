# PgBouncer from Debian (trixie's is >= 1.21, so deploy/pgbouncer.ini's max_prepared_statements holds).
FROM debian:trixie-slim
RUN apt-get update && apt-get install -y --no-install-recommends pgbouncer && rm -rf /var/lib/apt/lists/*
USER postgres
EXPOSE 6432
CMD ["pgbouncer", "/etc/pgbouncer/pgbouncer.ini"]
