from intentroute.cli import app

app()
