"""Documents generated from the code: the AsyncAPI 3 description of every subject and the
JSON Schemas of the messages (`intentroute docs asyncapi`); every Postgres role's
privileges, read from a live server (`intentroute docs permissions-postgres`); what every
NATS user may publish and subscribe to, probed on a live server (`intentroute docs
permissions-nats`); and the site's reference pages: the configuration from the settings
declarations (`docs config`), the CLI from its commands (`docs cli`), the subjects from
the AsyncAPI document (`docs subjects`), the metrics from the instruments (`docs
metrics`) and the architecture diagrams as SVG (`docs diagrams`)."""
