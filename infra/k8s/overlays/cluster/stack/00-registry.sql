-- The schema registry's storage (Apicurio, as in the local stack and compose: infra/compose/postgres-init).
CREATE DATABASE registry;
