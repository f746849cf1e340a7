"""The pure rules: names, links, liveness, job states, clocks, the mesh view, fan-out, retries."""
