import pytest

from wordfreq import top_words, words


def test_words_lowercase_and_apostrophes():
    assert words("Don't stop -- DON'T!") == ["don't", "stop", "don't"]


def test_quotes_stripped():
    assert words("'quoted' and ''") == ["quoted", "and"]


def test_top_words_ties_alphabetical():
    assert top_words("b a c b a c d", 3) == [("a", 2), ("b", 2), ("c", 2)]


def test_negative_n():
    with pytest.raises(ValueError):
        top_words("a", -1)
