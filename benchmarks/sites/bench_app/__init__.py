"""A stand-in for the application: one table the "web app" process writes to during the coexistence test."""
