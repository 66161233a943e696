-- The schema registry's storage (Apicurio, as the local stack's: its `registry` database).
CREATE DATABASE registry;
