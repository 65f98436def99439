"""The telecom user's device tools (tau2-bench `domains/telecom/user_tools.py`): what the simulated customer can
do on their own phone — tau2's dual control. The user role gets these as its tools; the agent only asks.

Same tool names, arguments, texts and state changes as tau2. Besides the tools, the functions tasks call
outside the conversation: setup (`set_user_info`, `turn_data_off`, `break_apn_settings`, ... from
`initial_state.initialization_actions`) and the `env_assertions` checks (`assert_*`), plain methods.
The phone's network state follows `simulate_network_search` (SIM, mode preference, airplane mode, APN, whether
the line is active) and the speed test is a fixed function of technology, signal, VPN and data saver.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.service.telecom.device import (
    APNNames,
    APNSettings,
    NetworkModePreference,
    NetworkStatus,
    NetworkTechnology,
    PerformanceLevel,
    Phone,
    SignalStrength,
    SimStatus,
    Surroundings,
    VpnDetails,
)
from turnforge.envs.service.toolkit import ToolKind, Toolkit, tool

_SIGNAL_ICON = {SignalStrength.NONE: "📵 No Signal", SignalStrength.POOR: "📶¹ Poor", SignalStrength.FAIR: "📶² Fair",
                SignalStrength.GOOD: "📶³ Good", SignalStrength.EXCELLENT: "📶⁴ Excellent"}
_MODE_TECH = {NetworkModePreference.FOUR_G_ONLY: NetworkTechnology.FOUR_G,
              NetworkModePreference.THREE_G_ONLY: NetworkTechnology.THREE_G,
              NetworkModePreference.TWO_G_ONLY: NetworkTechnology.TWO_G}
# tau2's speed model: Mbps range per technology, share of it per signal level
_TECH_MBPS = {NetworkTechnology.TWO_G: (0.1, 0.4), NetworkTechnology.THREE_G: (1.0, 5.0),
              NetworkTechnology.FOUR_G: (10.0, 100.0), NetworkTechnology.FIVE_G: (50.0, 500.0)}
_SIGNAL_FACTOR = {SignalStrength.POOR: 0.2, SignalStrength.FAIR: 0.5, SignalStrength.GOOD: 0.8,
                  SignalStrength.EXCELLENT: 1.0}
_SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}
_SIM_TEXT = {SimStatus.ACTIVE: "Your SIM card is active and working.",
             SimStatus.MISSING: "No SIM card detected in the phone.",
             SimStatus.LOCKED_PIN: "The SIM card is locked with a PIN code.",
             SimStatus.LOCKED_PUK: "The SIM card is locked with a PUK code."}
DEFAULT_VPN = VpnDetails(server_address="192.168.1.1", protocol="OpenVPN", server_performance=PerformanceLevel.EXCELLENT)


class DeviceTools(Toolkit):
    """The user's tools over the telecom user DB (`self.db.device`, `self.db.surroundings`)."""

    @property
    def device(self) -> Phone:
        return self.db.device

    @property
    def surroundings(self) -> Surroundings:
        return self.db.surroundings

    def _with_status_bar(self, text: str) -> str:
        return f"{text}\nStatus Bar: {self.status_bar()}"

    # ---- state the tools read ---------------------------------------------------------------------------------
    def status_bar(self) -> str:
        d = self.device
        icons = []
        if d.airplane_mode:
            icons.append("✈️ Airplane Mode")
        else:
            icons.append(_SIGNAL_ICON.get(d.network_signal_strength, "📵 No Signal"))
            if d.network_technology_connected != NetworkTechnology.NONE:
                icons.append(d.network_technology_connected.value)
            if d.data_enabled and d.network_technology_connected != NetworkTechnology.NONE:
                icons.append("📱 Data Enabled")
                if d.data_saver_mode:
                    icons.append("🔽 Data Saver")
            else:
                icons.append("📵 Data Disabled")
        if d.wifi_enabled and d.wifi_connected:
            icons.append(f"📡 Connected to {d.wifi_ssid}" if d.wifi_ssid else "📡 Enabled")
        if d.vpn_connected:
            icons.append("🔒 VPN Connected")
        icons.append(f"🔋 {d.battery_level}%")
        return " | ".join(icons)

    def sim_status(self) -> SimStatus:
        return SimStatus.MISSING if self.device.sim_card_missing else self.device.sim_card_status

    def mobile_data_working(self) -> bool:
        d, s = self.device, self.surroundings
        if d.airplane_mode or d.network_signal_strength == SignalStrength.NONE:
            return False
        if d.network_connection_status == NetworkStatus.NO_SERVICE:
            return False
        if s.is_abroad and not (d.roaming_enabled and s.roaming_allowed):
            return False
        return d.data_enabled and not s.mobile_data_usage_exceeded

    def speed(self) -> tuple[float | None, str]:
        """(Mbps, description); (None, "No Connection") when mobile data does not work."""
        if not self.mobile_data_working():
            return None, "No Connection"
        d = self.device
        factor = 0.1 if d.vpn_connected and d.vpn_details and d.vpn_details.server_performance == PerformanceLevel.POOR \
            else 1.0
        if d.data_saver_mode:
            factor *= 0.2
        low, high = _TECH_MBPS.get(d.network_technology_connected, (0.0, 0.0))
        mbps = round((low + high) / 2.0 * _SIGNAL_FACTOR.get(d.network_signal_strength, 0.0) * factor, 2)
        bands = ((1, "Very Poor"), (5, "Poor"), (25, "Fair"), (100, "Good"))
        return mbps, next((name for limit, name in bands if mbps < limit), "Excellent")

    def can_mms(self) -> bool:
        d = self.device
        if not self.mobile_data_working() or d.network_technology_connected == NetworkTechnology.TWO_G:
            return False
        if d.wifi_calling_enabled and d.wifi_calling_mms_over_wifi:  # the carrier does not support MMS over Wi-Fi
            return False
        if d.active_apn_settings.mmsc_url is None:
            return False
        app = d.app_statuses.get("messaging")
        return app is not None and app.permissions.storage and app.permissions.sms

    def simulate_network_search(self) -> None:
        """Re-evaluate the cellular connection from the SIM, the mode preference and what blocks service."""
        d = self.device
        signal = self.surroundings.signal_strength
        if self.sim_status() == SimStatus.ACTIVE:
            d.network_connection_status = NetworkStatus.CONNECTED
            tech = _MODE_TECH.get(d.network_mode_preference, NetworkTechnology.FOUR_G)
            if d.network_mode_preference == NetworkModePreference.FOUR_G_5G_PREFERRED:
                five_g = signal.get(NetworkTechnology.FIVE_G, SignalStrength.NONE)
                tech = NetworkTechnology.FOUR_G if five_g == SignalStrength.NONE else NetworkTechnology.FIVE_G
            d.network_technology_connected = tech
            d.network_signal_strength = signal.get(tech, SignalStrength.NONE)
        blocked = (self.sim_status() != SimStatus.ACTIVE or d.airplane_mode
                   or d.active_apn_settings.apn_name == APNNames.BROKEN or not self.surroundings.line_active)
        if blocked:
            d.network_connection_status = NetworkStatus.NO_SERVICE
            d.network_technology_connected = NetworkTechnology.NONE
            d.network_signal_strength = SignalStrength.NONE

    # ---- tools ------------------------------------------------------------------------------------------------
    @tool(ToolKind.READ)
    def check_status_bar(self) -> str:
        """Shows what icons are currently visible in your phone's status bar (the area at the top of the screen). Displays network signal strength, mobile data status (enabled, disabled, data saver), Wi-Fi status, and battery level."""
        return f"Status Bar: {self.status_bar()}"

    @tool(ToolKind.READ)
    def check_network_status(self) -> str:
        """Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode status, signal strength, network type, whether mobile data is enabled, and whether data roaming is enabled."""
        d = self.device
        on, yes = ("ON", "OFF"), ("Yes", "No")
        lines = [
            f"Airplane Mode: {on[not d.airplane_mode]}",
            f"SIM Card Status: {self.sim_status().value}",
            f"Cellular Connection: {d.network_connection_status.value}",
            f"Cellular Signal: {d.network_signal_strength.value}",
            f"Cellular Network Type: {d.network_technology_connected.value}",
            f"Mobile Data Enabled: {yes[not d.data_enabled]}",
            f"Data Roaming Enabled: {yes[not d.roaming_enabled]}",
            f"Wi-Fi Radio: {on[not d.wifi_enabled]}",
            f"Wi-Fi Connected: {yes[not d.wifi_connected]}",
        ]
        if d.wifi_connected:
            lines.append(f"Connected Wi-Fi Network: {d.wifi_ssid}")
        return "\n".join(lines)

    @tool(ToolKind.READ)
    def check_network_mode_preference(self) -> str:
        """Shows the current network mode preference."""
        return f"Network Mode Preference: {self.device.network_mode_preference.value}"

    @tool(ToolKind.WRITE)
    def set_network_mode_preference(self, mode: NetworkModePreference | str) -> str:
        """Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, 3G). Higher-speed networks (LTE/5G) provide faster data but may use more battery."""
        try:
            valid = NetworkModePreference(mode)
        except ValueError:
            options = ", ".join(m.value for m in NetworkModePreference)
            return self._with_status_bar(f"Failed to set network mode: '{mode}' is not a valid option. "
                                         f"Please use one of: {options}")
        self.device.network_mode_preference = valid
        self.simulate_network_search()
        return self._with_status_bar(f"Preferred Network Mode set to: {valid.value}")

    @tool(ToolKind.READ)
    def run_speed_test(self) -> str:
        """Measures your current internet connection speed (download speed). Provides information about connection quality and what activities it can support."""
        mbps, description = self.speed()
        if mbps is None:
            return f"Speed test failed: {description or 'Could not determine speed'}."
        return f"Speed Test Result: {mbps:.2f} Mbps ({description}). {_SPEED_ADVICE.get(description, '')}"

    @tool(ToolKind.WRITE)
    def toggle_airplane_mode(self) -> str:
        """Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications including cellular, Wi-Fi, and Bluetooth.
        Returns the new state of airplane_mode.
        """
        on = self._toggle_airplane_mode()
        return self._with_status_bar(f"Airplane Mode is now {'ON' if on else 'OFF'}.")

    def _toggle_airplane_mode(self) -> bool:
        d = self.device
        was_on = d.airplane_mode
        d.airplane_mode = not was_on
        if was_on:
            d.network_connection_status = NetworkStatus.SEARCHING
        if not was_on or d.wifi_enabled:
            d.wifi_connected, d.wifi_ssid, d.wifi_signal_strength = False, None, SignalStrength.NONE
        if not was_on and d.vpn_connected:
            self._disconnect_vpn()
        self.simulate_network_search()
        return d.airplane_mode

    @tool(ToolKind.READ)
    def check_sim_status(self) -> str:
        """Checks if your SIM card is working correctly and displays its current status. Shows if the SIM is active, missing, or locked with a PIN or PUK code."""
        status = self.sim_status()
        return _SIM_TEXT.get(status, f"Unknown SIM status: {status.value}")

    @tool(ToolKind.WRITE)
    def reseat_sim_card(self) -> str:
        """Simulates removing and reinserting your SIM card. This can help resolve recognition issues."""
        self.device.sim_card_missing = False
        self.simulate_network_search()
        return self._with_status_bar("SIM card re-seated successfully.")

    @tool(ToolKind.WRITE)
    def toggle_data(self) -> str:
        """Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use cellular data for internet access when Wi-Fi is unavailable.
        Returns the new data connection status.
        """
        on = self._toggle("data_enabled", search=True)
        return self._with_status_bar(f"Mobile Data is now {'ON' if on else 'OFF'}.")

    def _toggle(self, setting: str, search: bool) -> bool:
        value = not getattr(self.device, setting)
        setattr(self.device, setting, value)
        if search:
            self.simulate_network_search()
        return value

    @tool(ToolKind.WRITE)
    def toggle_roaming(self) -> str:
        """Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside your carrier's coverage.
        Returns the new data roaming status.
        """
        on = self._toggle("roaming_enabled", search=True)
        return self._with_status_bar(f"Data Roaming is now {'ON' if on else 'OFF'}.")

    @tool(ToolKind.READ)
    def check_data_restriction_status(self) -> str:
        """Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on."""
        return "Data Saver mode is ON (limits data usage)." if self.device.data_saver_mode else "Data Saver mode is OFF."

    @tool(ToolKind.WRITE)
    def toggle_data_saver_mode(self) -> str:
        """Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data speed.
        Returns the new data saver mode status.
        """
        on = self._toggle("data_saver_mode", search=False)
        return self._with_status_bar(f"Data Saver Mode is now {'ON' if on else 'OFF'}.")

    @tool(ToolKind.READ)
    def check_apn_settings(self) -> str:
        """Checks the technical APN settings your phone uses to connect to your carrier's mobile data network. Shows current APN name and MMSC URL for picture messaging."""
        apn = self.device.active_apn_settings
        return (f"Current APN Name: {apn.apn_name.value or 'Not Set'}\nMMSC URL (for picture messages): "
                f"{apn.mmsc_url or 'Not Set'}\n(These are technical settings, usually best left unchanged.)")

    @tool(ToolKind.WRITE)
    def set_apn_settings(self, apn_settings: APNSettings | dict) -> str:
        """Sets the APN settings for the phone."""
        if isinstance(apn_settings, dict):
            apn_settings = APNSettings(**apn_settings)
        self.device.active_apn_settings = apn_settings
        self.simulate_network_search()
        return self._with_status_bar(f"APN settings set to: {apn_settings.apn_name.value}")

    @tool(ToolKind.WRITE)
    def reset_apn_settings(self) -> str:
        """Resets your APN settings to the default settings."""
        self.device.active_apn_settings.reset_at_reboot = True  # applied at the next reboot
        self.simulate_network_search()
        return self._with_status_bar("APN settings will reset at reboot.")

    @tool(ToolKind.READ)
    def check_wifi_status(self) -> str:
        """Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're connected to (if any), and the signal strength."""
        d = self.device
        if not d.wifi_enabled:
            return "Wi-Fi is turned OFF."
        if d.wifi_connected:
            return f"Wi-Fi is ON and connected to '{d.wifi_ssid}'. Signal strength: {d.wifi_signal_strength.value}."
        return "Wi-Fi is ON but not connected to any network."

    @tool(ToolKind.WRITE)
    def toggle_wifi(self) -> str:
        """Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and connect to wireless networks for internet access.
        Returns the new Wi-Fi status.
        """
        d = self.device
        if d.airplane_mode:
            return self._with_status_bar("Cannot change Wi-Fi settings while Airplane Mode is ON.")
        d.wifi_enabled = not d.wifi_enabled
        if not d.wifi_enabled:
            d.wifi_connected, d.wifi_ssid, d.wifi_signal_strength = False, None, SignalStrength.NONE
        return self._with_status_bar(f"Wi-Fi is now {'ON' if d.wifi_enabled else 'OFF'}.")

    @tool(ToolKind.READ)
    def check_wifi_calling_status(self) -> str:
        """Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and receive calls over a Wi-Fi network instead of using the cellular network."""
        return f"Wi-Fi Calling is currently turned {'ON' if self.device.wifi_calling_enabled else 'OFF'}."

    @tool(ToolKind.WRITE)
    def toggle_wifi_calling(self) -> str:
        """Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over Wi-Fi instead of the cellular network, which can help in areas with weak cellular signal.
        Returns the new Wi-Fi Calling status.
        """
        on = self._toggle("wifi_calling_enabled", search=False)
        return self._with_status_bar(f"Wi-Fi Calling is now {'ON' if on else 'OFF'}.")

    @tool(ToolKind.READ)
    def check_vpn_status(self) -> str:
        """Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is active, connected, and displays any available connection details."""
        d = self.device
        if d.vpn_connected:
            if d.vpn_details:
                return f"VPN is ON and connected. Details: {d.vpn_details.model_dump()}"
            return "VPN is ON and connected (no specific details available)."
        if d.vpn_enabled_setting:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    @tool(ToolKind.WRITE)
    def connect_vpn(self) -> str:
        """Connects to your VPN (Virtual Private Network)."""
        if self.device.vpn_connected:
            return "VPN already connected."
        self.device.vpn_connected, self.device.vpn_details = True, DEFAULT_VPN.model_copy()
        return self._with_status_bar("VPN connected successfully.")

    @tool(ToolKind.WRITE)
    def disconnect_vpn(self) -> str:
        """Disconnects any active VPN (Virtual Private Network) connection. Stops routing your internet traffic through a VPN server, which might affect connection speed or access to content."""
        done = self._disconnect_vpn()
        return self._with_status_bar("VPN disconnected successfully." if done else "No active VPN connection to disconnect.")

    def _disconnect_vpn(self) -> bool:
        if not self.device.vpn_connected:
            return False
        self.device.vpn_connected, self.device.vpn_details = False, None
        return True

    @tool(ToolKind.READ)
    def check_installed_apps(self) -> str:
        """Returns the name of all installed apps on the phone."""
        return f"The following apps are installed on the phone: {', '.join(self.device.app_statuses)}"

    def _granted(self, app_name: str) -> list[str] | None:
        app = self.device.app_statuses.get(app_name)
        if app is None:
            return None
        return [name.replace("_", " ").lower() for name, allowed in app.permissions.model_dump().items() if allowed]

    @tool(ToolKind.READ)
    def check_app_status(self, app_name: str) -> str:
        """Checks detailed information about a specific app. Shows its permissions and background data usage settings."""
        granted = self._granted(app_name)
        if granted is None:
            return f"App '{app_name}' not found on this phone."
        lines = [f"Status for App: {app_name}"]
        lines += [" - Permissions Granted:", *(f"   - {p}" for p in granted)] if granted else \
            [" - Permissions: None granted."]
        return "\n".join(lines)

    @tool(ToolKind.READ)
    def check_app_permissions(self, app_name: str) -> str:
        """Checks what permissions a specific app currently has. Shows if the app has access to features like storage, camera, location, etc."""
        granted = self._granted(app_name)
        if granted is None:
            return f"App '{app_name}' not found on this phone."
        if not granted:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(granted)}."

    @tool(ToolKind.WRITE)
    def grant_app_permission(self, app_name: str, permission: str) -> str:
        """Gives a specific permission to an app (like access to storage, camera, or location). Required for some app functions to work properly.

        Args:
            app_name: The name of the app to grant the permission to.
            permission: The permission to grant, should be lowercase.
        """
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if app is None:
            text = f"Error. App '{app_name}' not found. Cannot grant permission."
        elif permission not in type(app.permissions).model_fields:
            text = (f"Error. Permission '{permission}' not tracked for app '{app_name}', available permissions: "
                    f"{list(type(app.permissions).model_fields)}")
        else:
            setattr(app.permissions, permission, True)
            text = f"Success. Permission '{permission}' granted to app '{app_name}'."
        return self._with_status_bar(text)

    @tool(ToolKind.READ)
    def can_send_mms(self) -> str:
        """Checks if the default messaging app can send MMS messages."""
        return f"Your messaging app {'can' if self.can_mms() else 'cannot'} send MMS messages."

    @tool(ToolKind.WRITE)
    def reboot_device(self) -> str:
        """Restarts your phone completely. This can help resolve many temporary software glitches by refreshing all running services and connections."""
        lines = []
        if self.device.active_apn_settings.reset_at_reboot:
            lines.append("Resetting APN settings...")
            self.device.active_apn_settings = APNSettings()
        lines.append("Restarting network services...")
        self.device.network_connection_status = NetworkStatus.SEARCHING
        self.simulate_network_search()
        return self._with_status_bar("\n".join(lines))

    @tool(ToolKind.READ)
    def check_payment_request(self) -> str:
        """Checks if the agent has sent you a payment request."""
        request = self.surroundings.payment_request
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request.bill_id} of {request.amount_due} USD."

    @tool(ToolKind.WRITE)
    def make_payment(self) -> str:
        """Makes a payment for the bill that the agent has sent you."""
        request = self.surroundings.payment_request
        if request is None:
            return "You do not have a payment request."
        request.paid = True
        return f"Payment of {request.amount_due} USD has been made for bill {request.bill_id}."

    # ---- task setup (initialization_actions) ------------------------------------------------------------------
    def set_user_info(self, name: str, phone_number: str) -> None:
        self.surroundings.name, self.surroundings.phone_number = name, phone_number

    def set_user_location(self, abroad: bool) -> None:
        self.surroundings.is_abroad = abroad

    def _turn(self, setting: str, value: bool, search: bool) -> None:
        """tau2's turn_X_on / off: toggle, and toggle back when that gave the other state (each toggle searches)."""
        if self._toggle(setting, search) != value:
            self._toggle(setting, search)

    def turn_airplane_mode_on(self) -> str:
        if not self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now ON."

    def turn_airplane_mode_off(self) -> str:
        if self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now OFF."

    def unseat_sim_card(self) -> str:
        self.device.sim_card_missing = True
        self.simulate_network_search()
        return "SIM card un-seated successfully."

    def lock_sim_card(self, mode: str) -> str:
        self.device.sim_card_status = {"pin": SimStatus.LOCKED_PIN, "puk": SimStatus.LOCKED_PUK}.get(
            mode, self.device.sim_card_status)
        self.simulate_network_search()
        return f"SIM card locked successfully in {mode} mode."

    def turn_data_on(self) -> str:
        self.device.data_enabled = True  # tau2: no network search here
        return "Data connection restored."

    def turn_data_off(self) -> str:
        self._turn("data_enabled", False, search=True)
        return "Data connection broken."

    def turn_roaming_on(self) -> str:
        self._turn("roaming_enabled", True, search=True)
        return "Data Roaming is now ON."

    def turn_roaming_off(self) -> str:
        self._turn("roaming_enabled", False, search=True)
        return "Data Roaming is now OFF."

    def turn_data_saver_mode_on(self) -> str:
        self._turn("data_saver_mode", True, search=False)
        return "Data Saver Mode is now ON."

    def turn_data_saver_mode_off(self) -> str:
        self._turn("data_saver_mode", False, search=False)
        return "Data Saver Mode is now OFF."

    def break_apn_settings(self) -> str:
        self.device.active_apn_settings.apn_name = APNNames.BROKEN
        self.simulate_network_search()
        return "APN settings broken. Please call reset_apn_settings() to fix."

    def break_apn_mms_setting(self) -> str:
        self.device.active_apn_settings.mmsc_url = None
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        self.device.wifi_calling_enabled = enabled
        text = f"Wi-Fi Calling is now {'ON' if enabled else 'OFF'}."
        if mms_over_wifi is not None:
            self.device.wifi_calling_mms_over_wifi = mms_over_wifi
            text += f"\nMMS over Wi-Fi is now {'ON' if mms_over_wifi else 'OFF'}."
        return text

    def break_vpn(self) -> str:
        self.connect_vpn()
        self.device.vpn_details.server_performance = PerformanceLevel.POOR
        return "VPN connection broken."

    def remove_app_permission(self, app_name: str, permission: str) -> tuple[bool, str]:
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if app is None:
            return False, f"App '{app_name}' not found. Cannot remove permission."
        if not hasattr(app.permissions, permission):
            return False, f"Permission '{permission}' not tracked for app '{app_name}'."
        setattr(app.permissions, permission, False)
        return True, f"Permission '{permission}' removed from app '{app_name}'."

    # ---- env assertions ---------------------------------------------------------------------------------------
    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        return self.device.airplane_mode == expected_status

    def assert_service_status(self, expected_status: str) -> bool:
        return self.device.network_connection_status == NetworkStatus(expected_status)

    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        return self.mobile_data_working() == expected_status

    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        return self.device.roaming_enabled == expected_status

    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        return self.device.data_saver_mode == expected_status

    def assert_internet_speed(self, expected_speed: float, expected_desc: str | None = None) -> bool:
        mbps, description = self.speed()
        fast = (mbps or 0.0) >= expected_speed
        return fast if expected_desc is None else fast and description.lower() == expected_desc.lower()

    def assert_internet_not_excellent(self) -> bool:
        return self.speed()[1].lower() != "excellent"

    def assert_can_send_mms(self, expected_status: bool) -> bool:
        return self.can_mms() == expected_status

    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        return self.surroundings.mobile_data_usage_exceeded == expected_status


def functions(toolkit: Toolkit) -> dict[str, Any]:
    """The public methods of a toolkit that tasks may call outside the conversation (setup, assertions)."""
    return {n: getattr(toolkit, n) for n in dir(toolkit) if not n.startswith("_") and callable(getattr(toolkit, n))}
