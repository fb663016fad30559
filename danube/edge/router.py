"""MQTT topic -> Danube topic, by the edge.yaml's topic_mappings in order (first match wins),
as upstream's bridge.rs: ``+`` matches one level and is captured ($1, $2, ...), ``#``
matches the rest (zero or more levels, not captured); ``extract_attributes`` turns captures
into message attributes."""


class Route:
    __slots__ = ("topic", "attributes")

    def __init__(self, topic, attributes):
        self.topic = topic
        self.attributes = attributes


class Router:
    def __init__(self, mappings):
        self._rules = [(m.mqtt_pattern.split("/"), m.danube_topic,
                        [(name, int(ref[1:])) for name, ref in m.extract_attributes.items()])
                       for m in mappings]
        # A device publishes to few topics, over and over: remember their routes (bounded).
        self._cache = {}

    def resolve(self, mqtt_topic):
        """The Route of ``mqtt_topic``, or None when no mapping matches."""
        hit = self._cache.get(mqtt_topic)
        if hit is not None:
            return hit
        levels = mqtt_topic.split("/")
        for pattern, topic, attrs in self._rules:
            captures = _match(pattern, levels)
            if captures is not None:
                route = Route(topic, {name: captures[i - 1] for name, i in attrs
                                      if i <= len(captures)})
                if len(self._cache) >= 4096:
                    self._cache.clear()
                self._cache[mqtt_topic] = route
                return route
        return None


def _match(pattern, levels):
    captures = []
    for i, seg in enumerate(pattern):
        if seg == "#":
            return captures
        if i >= len(levels):
            return None
        if seg == "+":
            captures.append(levels[i])
        elif seg != levels[i]:
            return None
    return captures if len(levels) == len(pattern) else None
