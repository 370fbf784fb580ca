"""The agents an episode can run: sandrl's LLM agent (fenced or tool-call actions), external harnesses
through a gateway session (mini-swe-agent, ``module:function``), and the scripted ones (oracle, null, replay)."""
