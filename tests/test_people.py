"""People in the browser: admins add people, change roles, deactivate, reactivate and reset
passwords from /people/, each change audited; a new person chooses their password at first sign-in;
nobody can remove the last admin."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEntry
from quicksave import people
from quicksave.models import PasswordToSet
from quicksave.roles import role_of
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db

STRONG = "a-long-password-of-mine-42"


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def ada(db: Any) -> User:
    return person("ada", "admin")


@pytest.fixture
def ada_page(ada: User) -> Client:
    return signed_in(ada)


def temporary_password(response: Any) -> str:
    found = re.search(r'id="temporary-password">([^<]+)</pre>', response.content.decode())
    assert found, response.content.decode()[:2000]
    return found.group(1)


def actions(target: str) -> list[tuple[str, str]]:
    entries = AuditEntry.objects.filter(target_type="user", target_id=target).order_by("id")
    return [(entry.actor_name, entry.action) for entry in entries]


def add(page: Client, **fields: str) -> Any:
    return page.post("/people/new/", {"username": "tom", "email": "", "role": "viewer", "password": "", **fields})


# ---------------------------------------------------------------- adding people


def test_an_admin_adds_a_person_whose_temporary_password_is_shown_once(ada_page: Client) -> None:
    response = add(ada_page, username="tom", email="tom@example.com", role="reviewer")

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    password = temporary_password(response)
    tom = User.objects.get(username="tom")
    assert tom.email == "tom@example.com"
    assert tom.check_password(password)
    assert role_of(tom) == "reviewer"
    assert PasswordToSet.objects.filter(user=tom).exists()
    assert actions("tom") == [("ada", "role.grant"), ("ada", "user.create")]
    create = AuditEntry.objects.get(action="user.create")
    assert password not in str(create.after)
    # Listed, with the password still to set.
    listed = ada_page.get("/people/").content.decode()
    assert 'data-person="tom"' in listed and "Password to set" in listed


def test_an_admin_may_choose_the_temporary_password(ada_page: Client) -> None:
    response = add(ada_page, password="chosen-for-tom-77")
    assert temporary_password(response) == "chosen-for-tom-77"
    assert User.objects.get(username="tom").check_password("chosen-for-tom-77")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"username": ""}, "username", "This field is required"),
        ({"username": "tom smith"}, "username", "User name:"),
        ({"username": "ADA"}, "username", "already called"),
        ({"email": "not an address"}, "email", "valid email"),
        ({"role": "owner"}, "role", "Select a valid choice"),
        ({"password": "123"}, "password", "Temporary password: This password is too short"),
        ({"username": "tomasso", "password": "tomasso1"}, "password", "too similar"),
        ({"username": "t" * 151}, "username", "at most 150 characters"),
        ({"username": "to\x00m"}, "username", "Null characters"),
        ({"password": "long-enough\x00-password"}, "password", "Null characters"),
        ({"email": "tom@example.com\x00"}, "email", "Null characters"),
    ],
)
def test_a_bad_new_person_is_refused_naming_the_field(
    ada_page: Client, fields: dict[str, str], field: str, words: str
) -> None:
    response = add(ada_page, **fields)

    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert words in " ".join(errors[field])
    # Shown beside its field on the page.
    body = response.content.decode()
    assert re.search(rf'id="field-{field}".*?class="errorlist', body, re.S)
    assert User.objects.count() == 1  # ada alone
    assert not AuditEntry.objects.filter(action="user.create").exists()


def test_an_invitation_emails_where_to_sign_in_but_never_the_password(ada_page: Client, mailoutbox: Any) -> None:
    response = add(ada_page, username="tom", email="tom@example.com", invite="on")

    password = temporary_password(response)
    [mail] = mailoutbox
    assert mail.to == ["tom@example.com"]
    assert "http://testserver/login/" in mail.body and '"tom"' in mail.body
    assert password not in mail.body
    assert "on its way to tom@example.com" in response.content.decode()
    assert actions("tom")[-1] == ("ada", "user.invite")


def test_an_invitation_needs_an_email_address(ada_page: Client, mailoutbox: Any) -> None:
    response = add(ada_page, username="tom", invite="on")
    assert response.status_code == 400
    assert list(response.context["form"].errors) == ["email"]
    assert not mailoutbox and not User.objects.filter(username="tom").exists()


def test_a_name_taken_between_form_and_write_is_refused(ada: User) -> None:
    people.create_person(actor=ada, username="tom", role="viewer")
    with pytest.raises(people.PeopleError) as refused:
        people.create_person(actor=ada, username="Tom", role="viewer")
    assert refused.value.field == "username"


# ---------------------------------------------------------------- first sign-in


def test_a_new_person_chooses_a_password_at_first_sign_in_before_anything_else(ada_page: Client) -> None:
    password = temporary_password(add(ada_page, username="tom", role="viewer"))
    tom_page = Client()

    signed = tom_page.post("/login/?next=/inbox/", {"username": "tom", "password": password, "next": "/inbox/"})
    assert signed.status_code == 302
    assert signed["Location"] == "/password/?next=%2Finbox%2F"
    # Every page sends them back there, and the API says why.
    assert tom_page.get("/")["Location"] == "/password/"
    assert tom_page.get("/checkpoints/00000000-0000-0000-0000-000000000000/")["Location"].startswith("/password/?next=")
    api = tom_page.get("/api/v1/threads/")
    assert api.status_code == 403
    assert api.json()["error"]["code"] == "password_not_set"
    form = tom_page.get("/password/")
    assert form.status_code == 200
    assert "Choose your password" in form.content.decode()
    assert "old_password" not in form.context["form"].fields

    done = tom_page.post("/password/", {"new_password1": STRONG, "new_password2": STRONG, "next": "/inbox/"})

    assert done.status_code == 302 and done["Location"] == "/inbox/"
    assert tom_page.get("/inbox/").status_code == 200  # still signed in, and free to go anywhere
    tom = User.objects.get(username="tom")
    assert tom.check_password(STRONG)
    assert not PasswordToSet.objects.filter(user=tom).exists()
    assert actions("tom")[-1] == ("tom", "user.password_set")
    # The next sign-in goes straight to the dashboard.
    again = Client().post("/login/", {"username": "tom", "password": STRONG})
    assert again["Location"] == "/"


def test_the_new_password_is_checked_and_errors_name_the_field(ada_page: Client) -> None:
    password = temporary_password(add(ada_page, username="tom"))
    tom_page = Client()
    tom_page.post("/login/", {"username": "tom", "password": password})

    mismatch = tom_page.post("/password/", {"new_password1": STRONG, "new_password2": STRONG + "x"})
    weak = tom_page.post("/password/", {"new_password1": "password", "new_password2": "password"})

    assert mismatch.status_code == 400 and list(mismatch.context["form"].errors) == ["new_password2"]
    assert weak.status_code == 400 and "too common" in " ".join(weak.context["form"].errors["new_password2"])
    assert tom_page.get("/")["Location"] == "/password/"  # still to choose
    assert PasswordToSet.objects.filter(user__username="tom").exists()


def test_a_next_that_leaves_the_site_is_not_followed(ada_page: Client) -> None:
    password = temporary_password(add(ada_page, username="tom"))
    tom_page = Client()
    tom_page.post("/login/", {"username": "tom", "password": password})
    done = tom_page.post("/password/", {"new_password1": STRONG, "new_password2": STRONG,
                                         "next": "https://evil.example.com/"})  # fmt: skip
    assert done["Location"] == "/"


def test_someone_without_a_temporary_password_changes_it_with_the_old_one(db: Any) -> None:
    vera = person("vera", "viewer")
    page = Client()
    page.post("/login/", {"username": "vera", "password": "vera-password-1"})
    assert page.get("/").status_code == 200  # no detour
    form = page.get("/password/")
    assert "old_password" in form.context["form"].fields
    wrong = page.post("/password/", {"old_password": "nope", "new_password1": STRONG, "new_password2": STRONG})
    assert wrong.status_code == 400 and list(wrong.context["form"].errors) == ["old_password"]
    page.post("/password/", {"old_password": "vera-password-1", "new_password1": STRONG, "new_password2": STRONG})
    vera.refresh_from_db()
    assert vera.check_password(STRONG)


# ---------------------------------------------------------------- roles


def test_changing_a_role_goes_through_grant_role_and_is_audited(ada_page: Client) -> None:
    tom = person("tom", "viewer")
    response = ada_page.post(f"/people/{tom.pk}/role/", {"role": "admin"})

    assert response.status_code == 302
    assert role_of(User.objects.get(pk=tom.pk)) == "admin"
    entry = AuditEntry.objects.filter(action="role.grant", target_id="tom").latest("id")
    assert (entry.actor_name, entry.before, entry.after) == ("ada", {"roles": ["viewer"]}, {"roles": ["admin"]})
    assert "tom is now an admin." in ada_page.get(response["Location"]).content.decode()


def test_the_same_role_again_changes_and_audits_nothing(ada_page: Client) -> None:
    tom = person("tom", "viewer")
    before = AuditEntry.objects.count()
    response = ada_page.post(f"/people/{tom.pk}/role/", {"role": "viewer"}, follow=True)
    assert "was a viewer already" in response.content.decode()
    assert AuditEntry.objects.count() == before


def test_an_unknown_role_is_refused_naming_the_field(ada_page: Client) -> None:
    tom = person("tom", "viewer")
    response = ada_page.post(f"/people/{tom.pk}/role/", {"role": "owner"})
    assert response.status_code == 400
    assert list(response.context["form"].errors) == ["role"]
    assert role_of(User.objects.get(pk=tom.pk)) == "viewer"


def test_the_last_admin_cannot_demote_themself(ada: User, ada_page: Client) -> None:
    before = AuditEntry.objects.count()
    response = ada_page.post(f"/people/{ada.pk}/role/", {"role": "viewer"})

    assert response.status_code == 409
    assert "last active admin" in " ".join(response.context["form"].errors["role"])
    assert role_of(User.objects.get(pk=ada.pk)) == "admin"
    assert AuditEntry.objects.count() == before


def test_an_admin_may_demote_themself_when_another_admin_remains(ada: User, ada_page: Client) -> None:
    person("bob", "admin")
    response = ada_page.post(f"/people/{ada.pk}/role/", {"role": "reviewer"})
    assert response.status_code == 302
    assert role_of(User.objects.get(pk=ada.pk)) == "reviewer"
    assert ada_page.get("/people/").status_code == 403  # no longer an admin


def test_a_deactivated_admin_does_not_count_as_the_other_admin(ada: User, ada_page: Client) -> None:
    bob = person("bob", "admin")
    bob.is_active = False
    bob.save()
    assert ada_page.post(f"/people/{ada.pk}/role/", {"role": "viewer"}).status_code == 409


def test_a_superusers_role_is_not_changed_from_the_page(ada_page: Client) -> None:
    root = User.objects.create_superuser("root", password="root-password-1")
    response = ada_page.post(f"/people/{root.pk}/role/", {"role": "viewer"})
    assert response.status_code == 400
    assert "superuser" in " ".join(response.context["form"].errors["role"])


# ---------------------------------------------------------------- deactivating


def test_deactivating_asks_first_then_ends_their_sessions_and_is_audited(ada_page: Client) -> None:
    tom = person("tom", "reviewer")
    tom_page = signed_in(tom)
    assert tom_page.get("/").status_code == 200

    confirm = ada_page.get(f"/people/{tom.pk}/deactivate/")
    assert confirm.status_code == 200
    assert 'id="confirm-deactivate"' in confirm.content.decode()
    assert User.objects.get(pk=tom.pk).is_active  # asking changed nothing

    done = ada_page.post(f"/people/{tom.pk}/deactivate/", {"reason": "left the team"})

    assert done.status_code == 302
    assert not User.objects.get(pk=tom.pk).is_active
    assert tom_page.get("/").status_code == 302  # their open session no longer works
    assert Client().post("/login/", {"username": "tom", "password": "tom-password-1"}).status_code == 200  # refused
    entry = AuditEntry.objects.get(action="user.deactivate")
    assert (entry.actor_name, entry.target_id, entry.reason) == ("ada", "tom", "left the team")
    assert "Deactivated" in ada_page.get("/people/").content.decode()


def test_an_over_long_reason_is_refused_naming_the_field(ada_page: Client) -> None:
    tom = person("tom", "viewer")
    response = ada_page.post(f"/people/{tom.pk}/deactivate/", {"reason": "x" * 501})
    assert response.status_code == 400
    assert list(response.context["form"].errors) == ["reason"]
    assert User.objects.get(pk=tom.pk).is_active


def test_the_last_admin_cannot_deactivate_themself(ada: User, ada_page: Client) -> None:
    confirm = ada_page.get(f"/people/{ada.pk}/deactivate/")
    assert 'id="last-admin"' in confirm.content.decode()
    assert 'id="confirm-deactivate"' not in confirm.content.decode()

    refused = ada_page.post(f"/people/{ada.pk}/deactivate/", {})

    assert refused.status_code == 409
    assert "last active admin" in refused.content.decode()
    assert User.objects.get(pk=ada.pk).is_active
    assert not AuditEntry.objects.filter(action="user.deactivate").exists()


def test_the_guard_holds_in_the_domain_function_too(ada: User) -> None:
    with pytest.raises(people.LastAdmin):
        people.deactivate(actor=ada, user=ada)
    with pytest.raises(people.LastAdmin):
        people.change_role(actor=ada, user=ada, role="reviewer")


def test_a_deactivated_person_is_reactivated_with_their_role(ada: User, ada_page: Client) -> None:
    tom = person("tom", "reviewer")
    people.deactivate(actor=ada, user=tom)
    assert ada_page.get(f"/people/{tom.pk}/reactivate/").status_code == 200
    assert ada_page.post(f"/people/{tom.pk}/reactivate/").status_code == 302
    tom = User.objects.get(pk=tom.pk)
    assert tom.is_active and role_of(tom) == "reviewer"
    assert actions("tom")[-2:] == [("ada", "user.deactivate"), ("ada", "user.reactivate")]


# ---------------------------------------------------------------- passwords


def test_a_password_reset_asks_first_ends_their_sessions_and_shows_the_new_one_once(ada_page: Client) -> None:
    tom = person("tom", "viewer")
    tom_page = signed_in(tom)
    assert ada_page.get(f"/people/{tom.pk}/reset-password/").status_code == 200
    assert User.objects.get(pk=tom.pk).check_password("tom-password-1")  # asking changed nothing

    response = ada_page.post(f"/people/{tom.pk}/reset-password/")

    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    password = temporary_password(response)
    tom = User.objects.get(pk=tom.pk)
    assert tom.check_password(password) and not tom.check_password("tom-password-1")
    assert tom_page.get("/").status_code == 302  # signed out
    assert PasswordToSet.objects.filter(user=tom).exists()
    entry = AuditEntry.objects.get(action="user.password_reset")
    assert entry.actor_name == "ada" and password not in str(entry.after)
    signed = Client().post("/login/", {"username": "tom", "password": password})
    assert signed["Location"] == "/password/"


# ---------------------------------------------------------------- who may


@pytest.mark.parametrize("role", [None, "viewer", "reviewer"])
def test_people_pages_are_for_admins_only(role: str | None) -> None:
    tom = person("tom", "viewer")
    page = signed_in(person("nina", role))
    for path in ["/people/", "/people/new/", f"/people/{tom.pk}/", f"/people/{tom.pk}/deactivate/",
                 f"/people/{tom.pk}/reset-password/", f"/people/{tom.pk}/reactivate/"]:  # fmt: skip
        assert page.get(path).status_code == 403, path
    assert page.post(f"/people/{tom.pk}/role/", {"role": "admin"}).status_code == 403
    assert page.post(f"/people/{tom.pk}/deactivate/").status_code == 403
    assert page.post("/people/new/", {"username": "x", "role": "admin"}).status_code == 403
    tom = User.objects.get(pk=tom.pk)
    assert tom.is_active and role_of(tom) == "viewer" and not User.objects.filter(username="x").exists()


def test_the_nav_offers_people_to_admins_only(ada_page: Client) -> None:
    assert 'id="nav-people"' in ada_page.get("/").content.decode()
    assert 'id="nav-people"' not in signed_in(person("rita", "reviewer")).get("/").content.decode()


def test_someone_unknown_is_a_404(ada_page: Client) -> None:
    assert ada_page.get("/people/999999/").status_code == 404
    assert ada_page.post("/people/999999/deactivate/").status_code == 404


def test_the_list_reads_a_bounded_number_of_queries(ada_page: Client, django_assert_max_num_queries: Any) -> None:
    for n in range(30):
        person(f"p{n:02}", ["viewer", "reviewer", "admin"][n % 3])
    with django_assert_max_num_queries(11):
        response = ada_page.get("/people/")
    assert response.content.decode().count("data-person=") == 31


def test_the_list_filters_by_name_and_says_when_nobody_matches(ada_page: Client) -> None:
    person("tom", "viewer")
    assert 'data-person="tom"' in ada_page.get("/people/?q=to").content.decode()
    empty = ada_page.get("/people/?q=zz").content.decode()
    assert "Nobody's name contains" in empty
