"""One server's parts: `build.build_server` assembles them from a `LoraplexConfig` into a `holder.Server`, which the
routes find in `app.state.server`; `running` starts and stops them around the engine; `loops` owns the background
work; `dashboard` gathers the dashboard's data from the parts."""
