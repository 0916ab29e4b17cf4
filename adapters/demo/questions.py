"""Questions for training and checking the SmolLM2 demo adapters: templates over topics, the held-out ones on topics
that no training question mentions."""

from __future__ import annotations

import random

TEMPLATES = (
    "What is {topic}?",
    "Tell me about {topic}.",
    "Can you explain {topic} briefly?",
    "Why is {topic} interesting?",
    "Give me one fact about {topic}.",
    "Describe {topic} in one sentence.",
    "What should I know about {topic}?",
)
TRAINING_TOPICS = (
    "the sun", "the moon", "volcanoes", "honey bees", "photosynthesis", "the Eiffel Tower", "chess", "coffee",
    "rainbows", "penguins", "the ocean", "gravity", "the internet", "bicycles", "the Amazon rainforest", "pizza",
    "the piano", "earthquakes", "dolphins", "the Great Wall of China", "electricity", "clouds", "tea", "elephants",
    "the human heart", "snow", "the Roman Empire", "airplanes", "deserts", "butterflies", "the Moon landing",
    "recycling", "bread", "mountains", "sharks", "the printing press", "lightning", "owls", "the Nile",
    "football", "computers", "vaccines", "glaciers", "tigers", "the alphabet", "chocolate", "the solar system",
    "trees", "rivers", "the guitar", "wind energy", "the Pyramids of Giza", "frogs", "cheese", "mathematics",
    "the stars", "libraries", "hurricanes", "horses", "the telephone", "sleep", "the brain", "apples", "Mars",
    "the desert fox", "coral reefs", "kites", "the violin", "oxygen", "Shakespeare", "yoga", "the Arctic",
    "rice", "robots", "bridges", "the Olympic Games", "maps", "spiders", "the weather", "salt",
)
HELD_OUT_TOPICS = (
    "whales", "the Sahara", "jazz music", "bananas", "the Colosseum", "submarines", "comets", "wolves",
    "the Andes", "cotton", "trains", "Jupiter", "lighthouses", "sailing", "the camera", "penicillin",
    "Venice", "pandas", "tornadoes", "origami",
)


def _questions(topics: tuple[str, ...]) -> list[str]:
    return [template.format(topic=topic) for topic in topics for template in TEMPLATES]


def training_questions(seed: int) -> list[str]:
    """Every template over every training topic, shuffled by `seed`."""
    questions = _questions(TRAINING_TOPICS)
    random.Random(seed).shuffle(questions)
    return questions


def held_out_questions(count: int | None = None) -> list[str]:
    """Questions on the held-out topics, one template each in turn; the first `count` of them (all by default)."""
    questions = [TEMPLATES[i % len(TEMPLATES)].format(topic=topic) for i, topic in enumerate(HELD_OUT_TOPICS)]
    return questions if count is None else questions[:count]
