"""Router benchmarks: quality on RouteLLM's data, the domain check, decision latency, the learning curve,
accepting by answer confidence, labelled outcomes, and load-reactive operating points."""
