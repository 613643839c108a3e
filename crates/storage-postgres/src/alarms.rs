//! PostgreSQL alarm job index (feature `alarms`).
